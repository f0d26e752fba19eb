"""The ``history`` section: what the server records during training (the recording policy)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from fedunlearn.config.base import Frozen
from fedunlearn.errors import ConfigError


class HistoryConfig(Frozen):
    """What the server records during training (global models are always kept).

    ``policy`` names a recording policy (``fedunlearn.history.policy.POLICIES``: ``all``,
    ``every``, ``none`` and those installed plugins declare, e.g. ``crab``, ``fedadp``). A
    policy with options reads them from the section named after it (``history.crab: {...}``):
    every key but ``policy``, ``every`` and ``encoding`` is such a section, kept in ``sections``
    (and written back beside ``policy`` by ``model_dump``; ``encoding`` only when it is not the
    default, so a config's dump and fingerprint stay as they were). The sections are kept as
    given; they are validated by the policy's own options model where the run is assembled
    (``fedunlearn.history.policy.resolve_history``, called by ``fedunlearn.runs``), which also
    fills the active policy's defaults. ``options(name)`` returns a validated section.
    """

    policy: str = Field("all", description="recording policy, by registered name")
    every: int = Field(5, ge=1, description="policy 'every': keep updates of every k-th round")
    encoding: Literal["float32", "float16"] = Field(
        "float32",
        description="how stored client updates are encoded: float32 (exact) or float16 (half "
        "the bytes; global models and aggregates stay float32)",
    )
    sections: dict[str, Any] = Field(
        default_factory=dict,
        description="policy name -> its options (the YAML keys history.<policy>)",
    )

    @model_validator(mode="before")
    @classmethod
    def _gather_sections(cls, data: Any) -> Any:
        """Move every key but the fields into ``sections`` (the YAML layout)."""
        if not isinstance(data, Mapping):
            return data
        fields = {"policy", "every", "encoding"}
        return {
            **{k: v for k, v in data.items() if k in fields},
            "sections": {k: v for k, v in data.items() if k not in fields},
        }

    @model_serializer(mode="wrap")
    def _sections_beside_policy(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = dict(handler(self))
        sections = data.pop("sections", {})
        if data.get("encoding") == "float32":  # the default: configs and fingerprints as before
            del data["encoding"]
        return {**data, **sections}

    def options(self, name: str, options_type: type[BaseModel] | None = None) -> BaseModel:
        """Return the options of policy ``name``: its validated section, else its defaults.

        Args:
            name: The policy.
            options_type: The policy's options model (``PolicySpec.options_type``): its defaults
                are returned when the section is absent.

        Raises:
            ConfigError: The section was not validated (the config was not assembled by
                ``fedunlearn.history.policy.resolve_history``; ``fedunlearn.runs`` does), or
                it is absent and no ``options_type`` is given.
        """
        value = self.sections.get(name)
        if isinstance(value, BaseModel):
            return value
        if value is None and options_type is not None:
            return options_type()
        raise ConfigError(
            f"history.{name} has not been validated; assemble the config with "
            "fedunlearn.history.policy.resolve_history (fedunlearn.runs does) before reading "
            "a policy's options"
        )
