"""The typed record of a store's metadata: ``RunMeta``, read and validated in one place.

A store keeps its run's metadata as one JSON object (``HistoryStore.meta``): the run's config,
its clients, the recording policy and the state a living run carries (its round target, the
first round free of forgotten clients, the models ``forget()`` dropped, a continuation in
progress, ...). Writers keep writing plain keys (``create``, ``update_meta``); readers read them
through ``RunMeta`` (``HistoryStore.run_meta``, or ``parse_run_meta`` of a method's view of the
history), which types every known key and says in one line which key holds a wrong value.

Versioned: ``schema_version`` is the version of this record (1 when the metadata does not say,
as in every run written so far). Unknown keys (a newer fedunlearn's, a plugin's such as
Starfish's shares) are kept and passed through (``extra``), so old and newer runs still open.
The file format is unchanged.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from fedunlearn.errors import HistoryCorruptError

__all__ = ["META_SCHEMA_VERSION", "Continuation", "RunMeta", "parse_run_meta", "run_meta_of"]

_T = TypeVar("_T")

#: The version of ``RunMeta`` this fedunlearn reads and (as its default) assumes.
META_SCHEMA_VERSION = 1


class Continuation(BaseModel):
    """A continuation of training in progress: from round ``from``, ``rounds`` more, to ``target``.

    Written by ``fedunlearn continue`` before its first round (``runs.lifecycle``).
    """

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="allow")

    start: StrictInt = Field(alias="from")
    rounds: StrictInt
    target: StrictInt

    def to_dict(self) -> dict[str, int]:
        """The record as stored: ``{"from", "rounds", "target"}``."""
        return {"from": self.start, "rounds": self.rounds, "target": self.target}


class RunMeta(BaseModel):
    """Every metadata key fedunlearn reads, typed (see the module docstring).

    Attributes:
        schema_version: Version of this record (1 when absent: every run written so far).
        config: The run config as JSON (``RunConfig.model_dump(mode="json")``).
        malicious: Ids of the clients the run made malicious.
        num_params: Parameters of the model.
        client_sizes: Client id (as text) -> its number of samples.
        history_policy: The recording policy (``history.policy``).
        history_every: Its ``every`` (the ``every`` policy's stride).
        update_encoding: How stored updates are encoded (``history.encoding``; None: float32).
        records_of_stored_copy: True when the client records (norm, ||.||_inf, the dot with
            the aggregate) were computed from each update as the store holds it (its float16
            copy); absent in a float16 run recorded before that (its records describe the
            float32 deltas). See ``records_describe_stored_updates``.
        torch_threads: Threads the training used (a continuation and unlearning reuse them).
        executor: What the executor ``auto`` resolved to.
        device: The device the run trained on (what ``training.device: auto`` resolved to).
        wall_seconds: Training wall time so far.
        components: The user's model and data components of the run (plugins, factories).
        rounds_target: The round the run trains to (a continuation or an apply moves it).
        clean_from_round: First round after which no stored round carries a forgotten
            influence (``HistoryStore.clean_from_round``).
        dropped_models: ``(round, kind)`` of the models ``forget()`` dropped.
        continuation: A continuation in progress, if any.
        forgotten_samples: Client id (as text) -> sample ids applied results deleted.
        budget_restart: Where a continued DP run's budget schedule restarts.
        privacy_lineage: The privacy ledger of a DP run's applied results.
        flower_app: What a run recorded from a user's Flower app needs to be served again.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    schema_version: StrictInt = META_SCHEMA_VERSION
    config: dict[str, Any] | None = None
    malicious: list[StrictInt] = []
    num_params: StrictInt | None = None
    client_sizes: dict[str, StrictInt] = {}
    history_policy: str | None = None
    history_every: StrictInt | None = None
    update_encoding: str | None = None
    records_of_stored_copy: StrictBool | None = None
    torch_threads: StrictInt | None = None
    executor: str | None = None
    device: str | None = None
    wall_seconds: float | None = None
    components: dict[str, Any] | None = None
    rounds_target: StrictInt | None = None
    clean_from_round: StrictInt | None = None
    dropped_models: list[tuple[StrictInt, str]] = []
    continuation: Continuation | None = None
    forgotten_samples: dict[str, list[StrictInt]] = {}
    budget_restart: dict[str, Any] | None = None
    privacy_lineage: dict[str, Any] | None = None
    flower_app: dict[str, Any] | None = None

    @property
    def extra(self) -> dict[str, Any]:
        """The keys this record does not know, as stored (a plugin's, a newer fedunlearn's)."""
        return dict(self.model_extra or {})

    @property
    def training(self) -> dict[str, Any]:
        """The config's ``training`` section ({} without one)."""
        return dict((self.config or {}).get("training") or {})

    @property
    def privacy(self) -> dict[str, Any]:
        """The config's ``privacy`` section ({} without one)."""
        return dict((self.config or {}).get("privacy") or {})

    @property
    def half_updates(self) -> bool:
        """Whether the run stores its client updates in float16 (read back as float32)."""
        return self.update_encoding == "float16"

    @property
    def records_describe_stored_updates(self) -> bool:
        """Whether a client record's values (norm, ||.||_inf, dot) are those of its stored update.

        The one place that decides whether a method may take them instead of reading the
        update: true when updates are stored as computed (float32), and for a float16 store
        whose recorder computed the records from the float16 copies it stores, upcast as
        ``read_update`` upcasts them (``records_of_stored_copy``). A float16 run recorded
        before that holds records of the float32 deltas: its updates are read.
        """
        return self.update_encoding in (None, "float32") or self.records_of_stored_copy is True

    @property
    def client_ids(self) -> set[int]:
        """The run's client ids (``client_sizes``' keys)."""
        return {int(c) for c in self.client_sizes}

    def planned_rounds(self, configured: _T) -> int | _T:
        """The round the run trains to: ``rounds_target`` if recorded, else ``configured``."""
        return configured if self.rounds_target is None else self.rounds_target

    def sizes(self) -> dict[int, int]:
        """Client id -> number of samples."""
        return {int(c): n for c, n in self.client_sizes.items()}


def parse_run_meta(meta: dict[str, Any], source: str = "the store") -> RunMeta:
    """Read a store's metadata into a ``RunMeta``.

    Args:
        meta: The metadata object (``HistoryStore.meta`` or a method's view's ``meta``).
        source: What holds it, for the error (the store's file).

    Raises:
        HistoryCorruptError: A known key holds a value of the wrong type (one line naming
            the key); nothing was changed.
    """
    try:
        return RunMeta.model_validate(meta)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        value = repr(err["input"])
        value = value if len(value) <= 60 else value[:57] + "..."
        raise HistoryCorruptError(
            f"{source}: the run's metadata key '{key}' holds {value}: "
            f"{err['msg'][:1].lower()}{err['msg'][1:]}; nothing was changed. Restore the store "
            "from a backup, or rerun."
        ) from None


def run_meta_of(history: Any) -> RunMeta:
    """The typed metadata of a store or of any ``HistoryReader`` (a method's view of one).

    A ``HistoryStore``'s own ``run_meta`` (its errors name the file); otherwise its ``meta``
    parsed here.
    """
    typed = getattr(history, "run_meta", None)
    if isinstance(typed, RunMeta):
        return typed
    return parse_run_meta(history.meta, str(getattr(history, "file", "the run's history")))
