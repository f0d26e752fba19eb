"""What every config section shares: the frozen base model and the user-component checks."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    SerializerFunctionWrapHandler,
    model_serializer,
)


class Frozen(BaseModel):
    """A config section: frozen, unknown keys refused, numbers finite."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


#: A user component: ``"pkg.module:function"`` (the attribute may be dotted: ``"pkg.m:Cls.make"``).
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
_COMPONENT = rf"^{_DOTTED}:{_DOTTED}$"


def component(value: str | None) -> str | None:
    """Return ``value`` if it is ``"pkg.module:function"`` or a registered name (None passes)."""
    if value is not None and not (
        re.fullmatch(_COMPONENT, value) or re.fullmatch(_REGISTERED, value)
    ):
        raise ValueError(
            "must name a function as 'pkg.module:function' (module path, a colon, the "
            "attribute) or by a name an installed package registers"
        )
    return value


#: An optional user-component field (``str | None``), checked by ``component``.
Component = Annotated[str | None, AfterValidator(component)]


def changed(section: BaseModel, names: frozenset[str] | set[str]) -> list[str]:
    """Return which of ``names`` differ from their default in ``section`` (sorted)."""
    fields = type(section).model_fields
    return sorted(n for n in names if getattr(section, n) != fields[n].get_default())


def refuse_replaced(
    section: BaseModel,
    names: frozenset[str] | set[str],
    *,
    replaced_by: str,
    joiner: str,
    options: str,
) -> None:
    """Raise ``ValueError`` if any of ``names`` is set beside the component that replaces them.

    Args:
        section: The config section.
        names: Fields the component makes meaningless (``changed`` from their defaults).
        replaced_by: The component, as the message names it, and what it does
            (``"model.factory 'pkg:make' builds the model"``); its section prefixes the fields.
        joiner: Joins the clashing fields' names (``", "``, ``" and "``).
        options: Where the component's own options go, the message's last clause.
    """
    clash = changed(section, names)
    if clash:
        prefix = replaced_by.split(".", 1)[0]
        raise ValueError(
            f"{replaced_by}; {prefix}.{f'{joiner}{prefix}.'.join(clash)} cannot apply to it. "
            f"Drop {'it' if len(clash) == 1 else 'them'}; {options}"
        )


#: A name registered under the entry-point group ``fedunlearn.models`` / ``fedunlearn.datasets``.
_REGISTERED = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"
#: The largest finite float32: the engine's tensors cannot hold a step size past it.
FLOAT32_MAX = 3.4028234663852886e38


def one_of(values: Sequence[str]) -> str:
    """Return ``'a', 'b' or 'c'``, as pydantic lists a ``Literal``'s allowed values."""
    shown = [repr(v) for v in values]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


class Variant(Frozen):
    """One variant of a section whose key picks it, dumped in the section's stored layout.

    ``LAYOUT`` names every key the section stored before it was split into variants, in that
    order, with its default. The dump writes each: another variant's options at their defaults,
    so ``config.yaml``, the store's copy of the config and the run fingerprint (a digest of the
    dump) are what they were; ``pick_variant`` drops those defaults again on loading.
    """

    LAYOUT: ClassVar[tuple[tuple[str, Any], ...]] = ()

    def options(self, *exclude: str) -> dict[str, Any]:
        """Return this variant's own fields and values, but ``exclude``."""
        return {k: getattr(self, k) for k in type(self).model_fields if k not in exclude}

    @model_serializer(mode="wrap")
    def _stored_layout(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = dict(handler(self))
        own = type(self).model_fields
        layout = {
            k: data[k] if k in own else default
            for k, default in self.LAYOUT
            if k in data or k not in own
        }
        return {**layout, **{k: v for k, v in data.items() if k not in layout}}


def pick_variant(
    data: Any, *, section: str, key: str, variants: Mapping[str, type[BaseModel]]
) -> Any:
    """Prepare a section whose ``key`` picks one of ``variants`` (a discriminated union).

    Before the union validates it: ``key`` defaults to the first variant; an unknown value is
    refused as a ``Literal`` would be; an option of *another* variant is refused naming both
    variants, unless it holds its default (configs dumped before the split into variants list
    every variant's options at their defaults; dropping those changes nothing).

    Raises:
        ValueError: one line naming ``section.key`` or ``section.<option>``.
    """
    if not isinstance(data, Mapping):
        return data  # a variant's model instance, or a bad type pydantic reports
    data = dict(data)
    tag = data.setdefault(key, next(iter(variants)))
    if not isinstance(tag, str) or tag not in variants:
        raise ValueError(f"{section}.{key}: Input should be {one_of(list(variants))} (got {tag!r})")
    own = variants[tag].model_fields
    for name in [n for n in data if n not in own]:
        owners = [t for t, model in variants.items() if name in model.model_fields]
        if not owners:
            continue  # no variant's option: pydantic names it ("Extra inputs are not permitted")
        if data[name] == variants[owners[0]].model_fields[name].get_default():
            del data[name]
            continue
        raise ValueError(
            f"{section}.{name} is an option of {section}.{key} {one_of(owners)}, not of "
            f"'{tag}' (got {data[name]!r}); drop it or change {section}.{key}"
        )
    return data
