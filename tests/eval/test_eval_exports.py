import fedunlearn.eval as eval_pkg


def test_every_public_name_imports_and_is_documented():
    assert eval_pkg.__all__ == sorted(eval_pkg.__all__)
    for name in eval_pkg.__all__:
        obj = getattr(eval_pkg, name)
        assert obj.__doc__, name
