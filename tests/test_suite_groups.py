"""The suite's xdist groups (tests/conftest.py): who shares a worker, and the Flower group first."""

import pytest
from tests.conftest import FLOWER_FIXTURES, xdist_group_of


@pytest.fixture(scope="module")
def shared_state() -> list[int]:
    return [1, 2, 3]


def group_marker(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    return marker.args[0] if marker is not None else None


def test_a_test_using_a_module_fixture_shares_its_modules_worker(request, shared_state):
    assert shared_state == [1, 2, 3]
    assert xdist_group_of(request.node) == "module:tests/test_suite_groups.py"
    assert group_marker(request.node) == "module:tests/test_suite_groups.py"


def test_a_test_with_function_fixtures_only_goes_to_any_worker(request, tmp_path):
    assert tmp_path.is_dir()
    assert xdist_group_of(request.node) is None
    assert group_marker(request.node) is None


def test_the_flower_group_is_queued_before_every_other_test(request):
    groups = [xdist_group_of(item) for item in request.session.items]
    flower = [i for i, g in enumerate(groups) if g == "flower"]
    assert flower == list(range(len(flower)))  # a prefix of the run order (maybe empty)
    for item in request.session.items:
        if FLOWER_FIXTURES & set(item.fixturenames):
            assert group_marker(item) == "flower", item.nodeid
