"""Model files: a module's ``state_dict`` as safetensors, with its ``ModelSpec`` in the metadata.

``save_model(path, model, params=flat)`` writes named tensors (the keys of
``model.state_dict()``: ``net.1.weight``, ...) with safetensors, so the file opens anywhere
(``safetensors.torch.load_file`` gives a plain ``state_dict``); ``load_model(path)`` returns the
``torch.nn.Module`` again, bit for bit. The file's metadata (strings) holds:

- ``fedunlearn.format``: ``fedunlearn.model.v1``;
- ``fedunlearn.spec``: the ``ModelSpec`` as JSON (built-in name or user factory, input shape,
  class count, options), present whenever ``build_model`` built the module;
- ``fedunlearn.version`` and anything the caller adds (``fedunlearn export`` records the run and
  round, or the unlearning request, under ``fedunlearn.source``).

Loading never imports code named in a file: a built-in model is rebuilt from the registry; a
user module needs its factory (``load_model(path, factory=MyNet)``) or an instance
(``load_model(path, model=MyNet(...))``). Tied (shared) parameters are stored once, as
safetensors' ``save_model`` does.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model as _load_into
from safetensors.torch import save_model as _save_from
from torch import nn

import fedunlearn
from fedunlearn.errors import ConfigError
from fedunlearn.models.flat import set_flat_params
from fedunlearn.models.registry import MODELS, ModelFactory, ModelSpec, build_model, model_spec

__all__ = [
    "FORMAT",
    "load_model",
    "read_metadata",
    "read_spec",
    "save_model",
    "write_safetensors",
]

FORMAT = "fedunlearn.model.v1"
FORMAT_KEY = "fedunlearn.format"
SPEC_KEY = "fedunlearn.spec"
VERSION_KEY = "fedunlearn.version"


def save_model(
    path: str | Path,
    model: nn.Module,
    *,
    params: torch.Tensor | None = None,
    spec: ModelSpec | None = None,
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write ``model``'s ``state_dict`` (with ``params`` copied in first) to a safetensors file.

    The file is written next to ``path`` and renamed into place, so a crash or a full disk
    never leaves a half-written model under ``path``; the same module, params and metadata
    give the same bytes (``write_safetensors``).

    Args:
        path: File to write (conventionally ``*.safetensors``).
        model: The module, or the run's template module when ``params`` is given; it is not
            modified.
        params: The flat float32 vector (the engine's representation: parameters, then
            buffers, ``get_flat_params`` order) to write instead of the module's own state.
        spec: How to rebuild the module (default: the spec ``build_model`` recorded).
        metadata: Extra string entries for the file's metadata.

    Returns:
        The path written.

    Raises:
        ConfigError: if ``params`` does not fit the model, a metadata value is not a string, or
            the spec's options are not JSON values.
        OSError: The file cannot be written (a full disk: ``ENOSPC``).
    """
    path = Path(path)
    module = copy.deepcopy(model).cpu()
    if params is not None:
        set_flat_params(module, params.detach().cpu())
    spec = spec if spec is not None else model_spec(model)
    meta = {"format": "pt", FORMAT_KEY: FORMAT, VERSION_KEY: fedunlearn.__version__}
    if spec is not None:
        meta[SPEC_KEY] = spec.to_json()
    for key, value in (metadata or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise ConfigError(
                f"model file metadata must map strings to strings; got {key!r}: {value!r}"
            )
        meta[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    write_safetensors(path, lambda tmp: _save_from(module, tmp, metadata=meta))
    return path


def _os_error(err: Exception, path: Path) -> OSError:
    """An ``OSError`` for a failed safetensors write (it reports the OS error in its text)."""
    found = re.search(r"(?:code: |os error )(\d+)", str(err))  # its Rust io::Error's text
    code = int(found.group(1)) if found else errno.EIO
    return OSError(code, os.strerror(code) if found else str(err), str(path))


def _canonical_header(path: Path) -> None:
    """Rewrite a safetensors file's header with its metadata first and sorted, in place.

    safetensors writes the ``__metadata__`` entries in a hash map's order, which changes from
    process to process, so the same tensors and metadata gave files with different bytes. The
    header is JSON padded with spaces to its recorded length; the same entries in a fixed order
    have the same length, so the tensor data does not move.
    """
    with path.open("r+b") as fh:
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(size))
        meta = header.pop("__metadata__", None)
        ordered = ({"__metadata__": dict(sorted(meta.items()))} if meta else {}) | header
        text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) <= size:  # otherwise (never seen) keep safetensors' own header
            fh.seek(8)
            fh.write(text + b" " * (size - len(text)))


def write_safetensors(path: str | Path, save: Callable[[str], None]) -> None:
    """Write a safetensors file atomically, with the same bytes for the same content.

    ``save(tmp)`` writes the file (``safetensors.torch.save_file`` and friends) to a temporary
    name beside ``path``; its header is put in a fixed order (``_canonical_header``), the file
    flushed to disk and renamed over ``path``: a crash or a full disk never leaves a part of a
    file under ``path``, and nothing under the temporary name.

    Raises:
        OSError: The file cannot be written (e.g. ``ENOSPC``: no space left), naming ``path``;
            safetensors' own error is turned into it.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        try:
            save(tmp)
        except SafetensorError as err:
            raise _os_error(err, path) from None
        _canonical_header(Path(tmp))
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def read_metadata(path: str | Path) -> dict[str, str]:
    """Return the string metadata of a safetensors file.

    Raises:
        ConfigError: if the file does not exist or is not a safetensors file.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"model file {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as fh:
            return dict(fh.metadata() or {})
    except (SafetensorError, OSError) as err:
        raise ConfigError(f"{path} is not a safetensors model file: {err}") from None


def read_spec(path: str | Path) -> ModelSpec | None:
    """Return the ``ModelSpec`` stored in a model file (None if it has none)."""
    text = read_metadata(path).get(SPEC_KEY)
    return None if text is None else ModelSpec.from_json(text)


def load_model(
    path: str | Path,
    *,
    factory: ModelFactory | None = None,
    model: nn.Module | None = None,
    device: str | torch.device = "cpu",
) -> nn.Module:
    """Return the ``torch.nn.Module`` saved in ``path``, in eval mode, on ``device``.

    Args:
        path: A file written by ``save_model`` (or ``fedunlearn export`` / ``--save-model``).
        factory: Builds a user module: ``factory(input_shape, num_classes, **options)`` with the
            file's spec (the same callable the run passed to ``build_model``).
        model: A module to load the weights into instead (any safetensors ``state_dict``
            file whose names and shapes fit it); it is modified and returned.
        device: Where the returned module lives.

    Raises:
        ConfigError: if the file is missing or not a safetensors file, if it holds a user
            module and neither ``factory`` nor ``model`` is given, or if its tensors do not fit
            the module (names listed).
    """
    path = Path(path)
    meta = read_metadata(path)
    spec = ModelSpec.from_json(meta[SPEC_KEY]) if SPEC_KEY in meta else None
    if model is None:
        model = _build(path, spec, factory)
    try:
        missing, unexpected = _load_into(model, str(path), strict=False)
    except (RuntimeError, SafetensorError) as err:  # shape mismatch
        raise ConfigError(
            f"{path} does not fit {type(model).__name__}: {str(err).splitlines()[0]}"
        ) from None
    if missing or unexpected:
        raise ConfigError(
            f"{path} does not fit {type(model).__name__}: missing tensors {sorted(missing)}, "
            f"unexpected tensors {sorted(unexpected)}"
        )
    return model.to(device).eval()


def _build(path: Path, spec: ModelSpec | None, factory: ModelFactory | None) -> nn.Module:
    """Build the empty module a file's spec describes."""
    if spec is None:
        raise ConfigError(
            f"{path} has no fedunlearn model spec (not written by fedunlearn); pass the module "
            "to fill: load_model(path, model=MyNet(...))"
        )
    options = dict(spec.options)
    if factory is not None:
        return build_model(factory, spec.input_shape, spec.num_classes, seed=0, **options)
    if spec.name in MODELS:
        return build_model(spec.name, spec.input_shape, spec.num_classes, seed=0, **options)
    raise ConfigError(
        f"{path} holds a user module built by {spec.factory or 'an unnamed factory'}; fedunlearn "
        "never imports code named in a file. Pass it: load_model(path, factory=<that callable>) "
        "or load_model(path, model=<an instance>)"
    )
