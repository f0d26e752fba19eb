"""Reading a run config: strict YAML, one-line errors, overrides, and the YAML dump."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fedunlearn.config.attacks import ATTACK_MODELS
from fedunlearn.config.migrate import migrate, migrate_key
from fedunlearn.config.run import RunConfig
from fedunlearn.config.training import AGGREGATOR_MODELS
from fedunlearn.errors import ConfigError

#: Where a discriminated union sits -> its variants: pydantic puts the variant's tag in an
#: error's location (``attack.backdoor.trigger_size``); the message names the key the user wrote.
_UNIONS: dict[tuple[str, ...], frozenset[str]] = {
    ("attack",): frozenset(ATTACK_MODELS),
    ("training", "aggregator"): frozenset(AGGREGATOR_MODELS),
}


#: A section whose key picks a variant -> (that key, the variants' models).
_SWITCHES: dict[tuple[str, ...], tuple[str, dict[str, Any]]] = {
    ("attack",): ("kind", dict(ATTACK_MODELS)),
    ("training", "aggregator"): ("name", dict(AGGREGATOR_MODELS)),
}


def _switch_variants(data: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Drop the file's options of a variant an override switches away from.

    ``--set attack.kind=label_flip`` on a file written for ``backdoor``: the file's
    ``trigger_size`` spoke of the variant the command line leaves, so it goes; an option the
    overrides give themselves stays and is checked as usual (``pick_variant``).
    """
    for path, (key, models) in _SWITCHES.items():
        dotted = ".".join((*path, key))
        section: Any = data
        for part in path:
            section = section.get(part) if isinstance(section, dict) else None
        new = overrides.get(dotted)
        if not isinstance(section, dict) or new not in models or section.get(key) == new:
            continue
        given = {k.removeprefix(".".join(path) + ".") for k in overrides}
        own = models[new].model_fields
        for name in [n for n in section if n not in own and n != key and n not in given]:
            if any(name in m.model_fields for m in models.values()):
                del section[name]


def _located(loc: tuple[int | str, ...]) -> str:
    """Return an error location as the dotted YAML path, without a union's variant tag."""
    for prefix, tags in _UNIONS.items():
        n = len(prefix)
        if loc[:n] == prefix and len(loc) > n and loc[n] in tags:
            loc = loc[:n] + loc[n + 1 :]
    return ".".join(str(p) for p in loc)


def _format_errors(err: ValidationError, source: str) -> str:
    parts = []
    for e in err.errors():
        where = _located(tuple(e["loc"])) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        got = e.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        if msg.startswith(f"{where}."):  # a nested section's own errors, already located
            parts.append(msg)
        else:
            parts.append(f"{where}: {msg}{shown}")
    return f"invalid configuration in {source}: " + "; ".join(parts)


def _non_finite(data: Any, where: str = "") -> list[str]:
    """Return the dotted paths of every NaN or infinite float in ``data``."""
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in _non_finite(v, f"{where}{k}.")]
    if isinstance(data, list | tuple):
        return [p for i, v in enumerate(data) for p in _non_finite(v, f"{where}{i}.")]
    if isinstance(data, float) and not math.isfinite(data):
        return [f"{where.rstrip('.')} ({data!r})"]
    return []


def parse_config(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    """Validate a plain dict into a ``RunConfig``.

    Raises:
        ConfigError: naming every offending field, the value received and what is allowed.
    """
    bad = _non_finite(data or {})
    if bad:
        raise ConfigError(
            f"invalid configuration in {source}: {', '.join(bad)}: numbers must be finite "
            "(no .inf or .nan); give a finite value"
        )
    try:
        return RunConfig.model_validate(data or {})
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping."""

    def construct_mapping(self, node: yaml.Node, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise ConfigError(
                        f"key {key!r} appears twice in one mapping (lines {seen[key]} and "
                        f"{line}); YAML would keep the last silently. Keep one"
                    )
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path, what: str = "config file") -> Any:
    """Read a YAML file strictly (no duplicate keys), turning every failure into ConfigError.

    Args:
        path: The file.
        what: What the file is, for messages ("config file", "--params-file").

    Raises:
        ConfigError: The file is missing, a directory, unreadable, not UTF-8 text, not valid
            YAML, or has a duplicated key; the message names the file and what to do.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist; check the path") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a directory; give a YAML file") from None
    except PermissionError:
        raise ConfigError(f"{what} {path} cannot be read (permission denied)") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{what} {path} is not UTF-8 text (byte {err.start} is 0x{err.object[err.start]:02x});"
            " give a YAML file"
        ) from None
    except OSError as err:
        raise ConfigError(f"{what} {path} cannot be read: {err.strerror or err}") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except ConfigError as err:
        raise ConfigError(f"{what} {path}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{what} {path} is not valid YAML{where}: {problem}") from None


def _examples() -> str:
    shipped = Path(__file__).resolve().parents[3] / "configs"
    names = sorted(p.name for p in shipped.glob("*.yaml")) if shipped.is_dir() else []
    if names:
        return f"start from an example in {shipped}: {', '.join(names)}"
    return "start from an example in the configs/ directory of the fedunlearn repository"


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Read a YAML file into a ``RunConfig``; ``overrides`` are merged over it (dotted keys ok).

    Raises:
        ConfigError: The file cannot be read, is not YAML, is empty, has a duplicated key or a
            non-finite number, or a field is invalid.
    """
    path = Path(path)
    data = read_yaml(path)
    if data is None:
        raise ConfigError(
            f"config file {path} is empty; a run config names at least data, model and "
            f"training ({_examples()})"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping; got {type(data).__name__}")
    try:  # an earlier layout, read as today's before an override applies to it
        data = migrate(data)
    except ValueError as err:
        raise ConfigError(f"invalid configuration in {path}: {err}") from None
    _switch_variants(data, overrides or {})
    for key, value in (overrides or {}).items():
        node = data
        *parents, leaf = migrate_key(key.split("."))
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return parse_config(data, str(path))


def dump_config(config: RunConfig) -> str:
    """Return the config as YAML (every field, defaults included)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
