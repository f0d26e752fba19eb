from __future__ import annotations

import hashlib
import io
import urllib.error
import urllib.request

import numpy as np
import pytest

from fedunlearn.data import download, load_dataset
from fedunlearn.data.download import RESOURCES, RemoteFile, Resource, fetch_file
from fedunlearn.errors import DataFormatError, DataUnavailableError


class FakeResponse(io.BytesIO):
    """What urlopen returns: a readable, closable stream with headers."""

    def __init__(self, payload: bytes) -> None:
        super().__init__(payload)
        self.headers = {"Content-Length": str(len(payload))}


def serve(monkeypatch, files: dict[str, bytes], *, down: tuple[str, ...] = ()) -> list[str]:
    """Serve ``files`` by URL suffix; hosts in ``down`` refuse. Return the URLs requested."""
    requested: list[str] = []

    def fake_urlopen(request, timeout=None):
        url = request.full_url
        requested.append(url)
        assert timeout is not None
        assert timeout <= 30  # never a blocking download
        if any(host in url for host in down):
            raise urllib.error.URLError("connection refused")
        name = url.rsplit("/", 1)[-1]
        if name not in files:
            raise urllib.error.HTTPError(url, 404, "Not Found", {}, None)
        return FakeResponse(files[name])

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    return requested


def md5(blob: bytes) -> str:
    return "md5:" + hashlib.md5(blob).hexdigest()


def test_offline_download_fails_fast_with_instructions(tmp_path, no_network):
    with pytest.raises(DataUnavailableError) as info:
        load_dataset("mnist", data_dir=tmp_path)

    message = str(info.value)
    assert "the download failed" in message
    assert "offline test machine" in message
    assert f"into {tmp_path / 'mnist'}" in message
    assert "train-labels-idx1-ubyte.gz" in message
    assert "FEDUNLEARN_DATA" in message
    # Only the first file's mirrors are tried; the other three files are not attempted.
    assert no_network == list(RESOURCES["mnist"].files[0].urls)


def test_offline_download_of_ag_news_and_cifar10_names_their_files(tmp_path):
    with pytest.raises(DataUnavailableError, match="Put train.csv, test.csv into .*ag_news_csv"):
        load_dataset("ag_news", data_dir=tmp_path)
    with pytest.raises(DataUnavailableError, match="Put cifar-10-python.tar.gz into"):
        load_dataset("cifar10", data_dir=tmp_path)


IDX_KEYS = {
    "train-images-idx3-ubyte.gz": "x_train",
    "train-labels-idx1-ubyte.gz": "y_train",
    "t10k-images-idx3-ubyte.gz": "x_test",
    "t10k-labels-idx1-ubyte.gz": "y_test",
}


def fake_mnist_resource(blobs: dict[str, bytes], mirrors: tuple[str, ...]) -> Resource:
    return Resource("mnist", tuple(RemoteFile(n, md5(b), mirrors) for n, b in blobs.items()))


def test_successful_download_is_verified_and_loads(
    tmp_path, monkeypatch, mnist_arrays, idx_encoder
):
    blobs = {name: idx_encoder(mnist_arrays[key]) for name, key in IDX_KEYS.items()}
    monkeypatch.setitem(
        RESOURCES, "mnist", fake_mnist_resource(blobs, ("https://down.test/", "https://up.test/"))
    )
    requested = serve(monkeypatch, blobs, down=("down.test",))

    ds = load_dataset("mnist", data_dir=tmp_path)

    np.testing.assert_array_equal(ds.y_train, mnist_arrays["y_train"])
    assert ds.meta["source"] == str(tmp_path / "mnist")
    assert sorted(p.name for p in (tmp_path / "mnist").iterdir()) == sorted(blobs)
    for name, blob in blobs.items():
        assert (tmp_path / "mnist" / name).read_bytes() == blob
    # Each file: the dead mirror first, then the live one.
    assert len(requested) == 8
    assert requested[0].startswith("https://down.test/")


def test_download_fetches_only_the_missing_files(tmp_path, monkeypatch, mnist_arrays, idx_encoder):
    blobs = {name: idx_encoder(mnist_arrays[key]) for name, key in IDX_KEYS.items()}
    monkeypatch.setitem(RESOURCES, "mnist", fake_mnist_resource(blobs, ("https://up.test/",)))
    (tmp_path / "mnist").mkdir()
    (tmp_path / "mnist" / "train-images-idx3-ubyte.gz").write_bytes(
        blobs["train-images-idx3-ubyte.gz"]
    )
    requested = serve(monkeypatch, blobs)

    load_dataset("mnist", data_dir=tmp_path)

    assert [url.rsplit("/", 1)[-1] for url in requested] == list(blobs)[1:]


def test_checksum_mismatch_deletes_the_file_and_raises(tmp_path, monkeypatch):
    remote = RemoteFile("train.csv", md5(b"expected content"), ("https://up.test/",))
    serve(monkeypatch, {"train.csv": b"tampered content"})

    with pytest.raises(DataFormatError, match="md5 is .*, expected .*; it was deleted"):
        fetch_file(remote, tmp_path / "ag" / "train.csv")

    assert list((tmp_path / "ag").iterdir()) == []  # neither the file nor a temporary


def test_checksum_mismatch_during_load_is_a_format_error(
    tmp_path, monkeypatch, mnist_arrays, idx_encoder
):
    blobs = {name: idx_encoder(mnist_arrays[key]) for name, key in IDX_KEYS.items()}
    monkeypatch.setitem(RESOURCES, "mnist", fake_mnist_resource(blobs, ("https://up.test/",)))
    serve(monkeypatch, {**blobs, "t10k-images-idx3-ubyte.gz": b"corrupt"})

    with pytest.raises(DataFormatError, match="t10k-images-idx3-ubyte.gz"):
        load_dataset("mnist", data_dir=tmp_path)

    assert not (tmp_path / "mnist" / "t10k-images-idx3-ubyte.gz").exists()
    assert (tmp_path / "mnist" / "train-images-idx3-ubyte.gz").exists()  # earlier files kept


def test_sha256_checksums_are_supported(tmp_path, monkeypatch):
    payload = b"a,b,c\n"
    remote = RemoteFile(
        "f.csv", "sha256:" + hashlib.sha256(payload).hexdigest(), ("https://up.test/",)
    )
    serve(monkeypatch, {"f.csv": payload})

    path = fetch_file(remote, tmp_path / "f.csv")

    assert path.read_bytes() == payload


def test_interrupted_transfer_leaves_no_partial_file(tmp_path, monkeypatch):
    class Broken(FakeResponse):
        def read(self, size=-1):
            raise TimeoutError("read timed out")

    monkeypatch.setattr(urllib.request, "urlopen", lambda request, timeout=None: Broken(b"xx"))
    remote = RemoteFile("f.bin", md5(b"xx"), ("https://up.test/",))

    with pytest.raises(DataUnavailableError, match="read timed out"):
        fetch_file(remote, tmp_path / "f.bin")

    assert list(tmp_path.iterdir()) == []


def test_mirror_list_and_checksums_are_well_formed():
    for name, resource in RESOURCES.items():
        for remote in resource.files:
            algorithm, _, digest = remote.checksum.partition(":")
            assert algorithm in ("md5", "sha256"), name
            assert len(digest) == {"md5": 32, "sha256": 64}[algorithm]
            assert all(url.startswith(("https://", "http://")) for url in remote.urls)
    assert download.TIMEOUT_SECONDS <= 15
