"""Option groups several commands share, each defined once: the receipt options.

``unlearn``, ``compare`` and ``audit`` issue receipts and take the same options for them:
``--thresholds``, ``--threshold``, ``--client-test/--no-client-test``,
``--client-test-references``, ``--distance-retrains`` and ``--explain`` (``unlearn`` and
``audit`` also ``--reference``; ``compare`` always judges against Retrain).
``receipt_options`` adds them to a command: the command declares one parameter ``receipt:
ReceiptFlags`` and gets them as one frozen value, whose ``options()`` is the library's
``ReceiptOptions`` (``fedunlearn.eval.plan``), thresholds read and checked. A new command that
issues receipts takes the decorator, so its flags cannot drift from the others'
(``tests/cli/test_command_modules.py`` checks that they do not).

No torch here: ``ReceiptOptions`` and the thresholds are imported when a command runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml
from pydantic import ValidationError

from fedunlearn.cli.common import (
    ClientTestOption,
    ClientTestReferencesOption,
    DistanceRetrainsOption,
    ExplainOption,
    ReferenceOption,
    ThresholdOption,
    ThresholdsFileOption,
)
from fedunlearn.errors import ConfigError

if TYPE_CHECKING:  # torch-heavy: imported in the functions, so --help stays fast
    from fedunlearn.eval import VerificationThresholds
    from fedunlearn.eval.plan import ReceiptOptions

__all__ = [
    "DEFAULT_RECEIPT_FLAGS",
    "RECEIPT_FLAGS",
    "ReceiptFlags",
    "load_thresholds",
    "receipt_options",
]

F = TypeVar("F", bound=Callable[..., Any])

#: The receipt options every receipt-issuing command takes: parameter name -> (type, default).
_GROUP: dict[str, tuple[Any, Any]] = {
    "thresholds": (ThresholdsFileOption, None),
    "threshold": (ThresholdOption, None),
    "client_test": (ClientTestOption, True),
    "client_test_references": (ClientTestReferencesOption, None),
    "distance_retrains": (DistanceRetrainsOption, 0),
    "explain": (ExplainOption, False),
}
_REFERENCE: tuple[Any, Any] = (ReferenceOption, "original")

#: The command-line flags of the group (``--reference`` apart: not every command takes it).
RECEIPT_FLAGS = (
    "--thresholds",
    "--threshold",
    "--client-test",
    "--no-client-test",
    "--client-test-references",
    "--distance-retrains",
    "--explain",
)


def load_thresholds(path: Path | None, items: Sequence[str] | None = ()) -> VerificationThresholds:
    """Return the thresholds from a YAML file and ``key=value`` overrides (defaults otherwise).

    ``path`` and ``items`` are ``--thresholds`` and ``--threshold`` as typer passes them (None
    when not given).

    Raises:
        ConfigError: if the file is missing or not a mapping, an item is not ``key=value``, or
            a value is out of its range (the field and the allowed range are named).
    """
    from fedunlearn.eval import VerificationThresholds

    values: dict[str, Any] = {}
    if path is not None:
        if not path.is_file():
            raise ConfigError(f"--thresholds {path}: no such file")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(
                f"--thresholds {path} must be a YAML mapping of threshold names to values, "
                "e.g. 'backdoor_fail: 0.1'"
            )
        values.update(loaded)
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--threshold takes key=value (e.g. backdoor_fail=0.1); got {item!r}")
        values[key.strip()] = yaml.safe_load(value)
    try:
        return VerificationThresholds.model_validate(values)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']} (got {e.get('input')!r})"
            for e in err.errors()
        )
        known = ", ".join(VerificationThresholds.model_fields)
        raise ConfigError(f"invalid verification thresholds: {problems}. Known: {known}") from None


@dataclass(frozen=True)
class ReceiptFlags:
    """The receipt options of one command line, as given.

    Attributes:
        thresholds: ``--thresholds``: a YAML file of thresholds, or None.
        threshold: ``--threshold key=value`` items.
        client_test: ``--client-test/--no-client-test``.
        distance_retrains: ``--distance-retrains``.
        explain: ``--explain``: print every check with its reason.
        reference: ``--reference`` (``original`` where the command does not take it).
        client_test_references: ``--client-test-references``: the client-level test's null;
            None when not given (the library's default, ``ReceiptOptions``).
    """

    thresholds: Path | None = None
    threshold: tuple[str, ...] = ()
    client_test: bool = True
    distance_retrains: int = 0
    explain: bool = False
    reference: str = "original"
    client_test_references: str | None = None

    def options(self, *, seed: int = 0, reference: str | None = None) -> ReceiptOptions:
        """The library's receipt options: thresholds read and checked, ``reference`` if given.

        Raises:
            ConfigError: bad thresholds (``load_thresholds``), an unknown reference or a band
                that cannot be measured (``ReceiptOptions``), or a client-test null given
                with ``--no-client-test`` (the test it chooses for does not run).
        """
        from fedunlearn.eval.plan import ReceiptOptions

        null = self.client_test_references
        if null is not None and not self.client_test:
            raise ConfigError(
                f"--client-test-references {null} chooses the client-level test's null, and "
                "--no-client-test turns that test off: drop one"
            )
        options = ReceiptOptions(
            reference or self.reference,
            load_thresholds(self.thresholds, self.threshold),
            client_test=self.client_test,
            distance_retrains=self.distance_retrains,
            seed=seed,
        )
        # not given: the library's default (one place: eval.references)
        return options if null is None else replace(options, client_test_references=null)


#: The default of a command's ``receipt`` parameter (``receipt_options`` fills it from the line).
DEFAULT_RECEIPT_FLAGS = ReceiptFlags()


def receipt_options(*, reference: bool = True) -> Callable[[F], F]:
    """Give a command the receipt options; it receives them as its ``receipt`` parameter.

    The command's own parameter ``receipt: ReceiptFlags = DEFAULT_RECEIPT_FLAGS`` is replaced,
    where it stands, by ``--reference`` (when ``reference``) and the group's options
    (``RECEIPT_FLAGS``), each defined once in ``cli.common``; typer reads the new signature.

    Args:
        reference: Whether the command takes ``--reference`` (``compare`` does not: it always
            judges against Retrain).
    """
    group = {"reference": _REFERENCE, **_GROUP} if reference else dict(_GROUP)

    def decorate(func: F) -> F:
        signature = inspect.signature(func, eval_str=True)
        if "receipt" not in signature.parameters:
            raise TypeError(f"{func.__name__} must take a 'receipt: ReceiptFlags' parameter")
        params: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            if param.name != "receipt":
                params.append(param)
                continue
            params += [
                inspect.Parameter(
                    name,
                    inspect.Parameter.POSITIONAL_OR_KEYWORD,
                    default=default,
                    annotation=annotation,
                )
                for name, (annotation, default) in group.items()
            ]

        @wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in group if name in kwargs}
            given["threshold"] = tuple(given.get("threshold") or ())
            return func(*args, receipt=ReceiptFlags(**given), **kwargs)

        command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command  # type: ignore[return-value]

    return decorate
