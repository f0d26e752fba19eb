"""The ``history`` section: what the server records during training (the recording policy)."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from fedunlearn.config.base import Frozen
from fedunlearn.errors import ConfigError


class HistoryConfig(Frozen):
    """What the server records during training (global models are always kept).

    ``policy`` names a recording policy (``fedunlearn.history.policy.POLICIES``: ``all``,
    ``every``, ``none`` and those installed plugins declare, e.g. ``crab``, ``fedadp``). A
    policy with options reads them from the section named after it (``history.crab: {...}``).
    This model stores the name and the sections as given; they are validated by the policy's
    own options model where the run is assembled (``fedunlearn.history.policy.resolve_history``,
    called by ``fedunlearn.runs``), which also fills the active policy's defaults.
    ``options(name)`` returns a validated section.
    """

    model_config = ConfigDict(frozen=True, extra="allow", allow_inf_nan=False)

    policy: str = Field("all", description="recording policy, by registered name")
    every: int = Field(5, ge=1, description="policy 'every': keep updates of every k-th round")

    # set by ``resolve_history``: name -> the policy's options model (its defaults, when the
    # section is absent); None until the config is assembled
    _options_type: Callable[[str], type[BaseModel] | None] | None = PrivateAttr(None)

    def options(self, name: str) -> BaseModel:
        """Return the options of policy ``name``: its validated section, else its defaults.

        Raises:
            ConfigError: Policy ``name`` has no options, or the config was not assembled by
                ``fedunlearn.history.policy.resolve_history`` (``fedunlearn.runs`` does).
        """
        value = (self.__pydantic_extra__ or {}).get(name)
        if isinstance(value, BaseModel):
            return value
        if value is None and self._options_type is not None:
            options_type = self._options_type(name)
            if options_type is None:
                raise ConfigError(f"history policy '{name}' has no options")
            return options_type()
        raise ConfigError(
            f"history.{name} has not been validated; assemble the config with "
            "fedunlearn.history.policy.resolve_history (fedunlearn.runs does) before reading "
            "a policy's options"
        )
