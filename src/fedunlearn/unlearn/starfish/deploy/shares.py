"""Starfish Stage I as the two servers hold it: one share store per server, and reading it back.

``share_history`` turns a recorded run (``history.policy: all``) into what S1 and S2 would have
stored had the clients secret-shared live (Alg. 4 lines 1-9): for every accepted
upload of round r by client j, the vector [G_r^j, ||G_r^j||, delta_r^j] (pseudo-gradient, its
norm and its alpha-quantile threshold, computed as the client computes them, SF1/SF10) is
fixed-point encoded and split as r, v - r with a fresh uniform mask from AES-CTR; server 0's
store gets r, server 1's gets v - r. Nothing else about the upload is kept (no plaintext norm,
loss or per-client metric). Public data is copied as it is: the global models M_0..M_T, the
opened aggregates, who took part in each round and their sample counts, the run's metadata.

Each store is a :class:`~fedunlearn.history.store.HistoryStore` (one SQLite file, one
transaction per round, CRC-32 per payload): the share vector is an ``update`` payload of dtype
uint64 and shape (m + 2,). Layout: ``RUN/starfish/server0/`` and ``RUN/starfish/server1/``.
The stores' metadata (key ``starfish_shares``) records the sharing id (random, the same in
both stores: a deployment binds its sessions to it), party, fractional bits, tolerance rate,
units, the scale G = scale * delta, the SHA-256 of every share payload the store holds
(``payload_digests``) and both stores' roots over them (``payloads``, bound into every
session; each read is checked against them). A store's directory is 0700 and its files 0600,
whatever the umask. ``ensure_shares`` makes both stores of a run directory
once, with the settings a method needs (``share_settings``), for the process deployment, and
writes the sharing's public side (id and settings, what the clients know after Stage I) to
``RUN/starfish/sharing.json``.

``SharedStageOneRecord`` is the servers' side of :class:`~fedunlearn.unlearn.starfish.steps.
StageOneRecord`: it wraps the stored uint64 shares as ``SharedTensor``s of one party.
``server_context`` builds the ``UnlearnContext`` a server process runs on: its share store,
the public config, and the remaining clients as public metadata (training goes through a
client gateway, never through the server).

Paper: Liu et al., "Privacy-Preserving Federated Unlearning with Certified Client Removal",
Alg. 4 (Stage I), Sec. III-C (public global models), Sec. V-B (server memory).
Deviations (docs/methods/starfish.md, SF18): shares are made after training from the recorded
plaintext run (a simulation of live sharing: same values, same distribution of shares; a
deployment shares at upload time); the opened training aggregate is stored (public), as are
the round's participant records (status, sample count), which FedAvg weights need (SF16).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedunlearn.config import RunConfig
from fedunlearn.errors import (
    ConfigError,
    HistoryCorruptError,
    HistoryError,
    UnsupportedHistoryError,
)
from fedunlearn.fl.aggregators import fedavg
from fedunlearn.fl.client import LocalTrainingSpec
from fedunlearn.fl.clients import TrainTask
from fedunlearn.fl.records import ClientUpdate
from fedunlearn.history.store import (
    ClientRecord,
    HistoryReader,
    HistoryStore,
    RoundEntry,
    run_meta_of,
)
from fedunlearn.mpc import FixedPoint, Prg, SharedTensor
from fedunlearn.mpc.prg import derive_seed, fresh_seed
from fedunlearn.runs import HISTORY_DIR, load_run_config
from fedunlearn.unlearn.context import CostMeter, MeteredHistory, TrainingInfo, UnlearnContext
from fedunlearn.unlearn.starfish.backend.plain import PlainBackend
from fedunlearn.unlearn.starfish.backend.ranges import StepRanges
from fedunlearn.unlearn.starfish.deploy.binding import (
    PAYLOAD_DIGESTS_KEY,
    SHARING_FILE,
    PayloadManifest,
    new_sharing_id,
    write_sharing,
)
from fedunlearn.unlearn.starfish.steps import StageOneRecord
from fedunlearn.unlearn.starfish.unlearner import Starfish

__all__ = [
    "SHARE_META_KEY",
    "PublicClients",
    "SharedStageOneRecord",
    "ensure_shares",
    "server_context",
    "share_history",
    "share_meta",
    "share_settings",
    "share_store_dir",
]

SHARE_META_KEY = "starfish_shares"
SHARES_DIR = "starfish"


def share_store_dir(run_dir: str | Path, party_id: int) -> Path:
    """Return ``RUN/starfish/server<party_id>``, where that server's Stage I shares live."""
    return Path(run_dir) / SHARES_DIR / f"server{int(party_id)}"


def share_settings(method: Starfish) -> dict[str, Any]:
    """Return what a share store is made with and must match: ``frac_bits``, alpha, units."""
    return {
        "frac_bits": method.execution.frac_bits,
        "tolerance_rate": method.params.tolerance_rate,
        "units": method.params.units,
    }


def ensure_shares(run_dir: str | Path, method: Starfish, force: bool = False) -> bool:
    """Create ``RUN/starfish/server0|1`` from the run's history unless present; return if made.

    Args:
        run_dir: A finished run (``history.policy: all``).
        method: The Starfish method the shares are for (``share_settings``).
        force: Replace existing stores.

    Raises:
        HistoryError: Only one of the two stores exists (re-share with ``force``).
    """
    run_dir = Path(run_dir)
    dirs = [share_store_dir(run_dir, k) for k in (0, 1)]
    present = [(d / "history.sqlite").exists() for d in dirs]
    if all(present) and not force:
        return False
    if any(present) and not force:
        raise HistoryError(
            f"only one of {dirs[0]} and {dirs[1]} holds a share store; re-share with --force"
        )
    for d in dirs:
        for suffix in ("", "-wal", "-shm"):
            (d / f"history.sqlite{suffix}").unlink(missing_ok=True)
    (run_dir / SHARES_DIR / SHARING_FILE).unlink(missing_ok=True)
    config = load_run_config(run_dir)
    sharing_id = new_sharing_id()
    with HistoryStore.open(run_dir / HISTORY_DIR) as history:
        share_history(
            history,
            dirs,
            lr=config.training.lr,
            sharing_id=sharing_id,
            **share_settings(method),
        )
    with HistoryStore.open(dirs[0]) as store:
        write_sharing(run_dir, share_meta(store))
    return True


def share_history(
    history: HistoryReader,
    out_dirs: Sequence[str | Path],
    *,
    lr: float,
    frac_bits: int = 16,
    tolerance_rate: float = 0.4,
    units: str = "gradient",
    seed: int | None = None,
    sharing_id: str | None = None,
) -> None:
    """Secret-share a recorded run's Stage I history into two per-server share stores.

    Args:
        history: The plaintext run history (policy ``all``), read once, round by round.
        out_dirs: The two store directories (server 0, server 1); they must not hold a store.
        lr: The clients' local learning rate eta_l (gradient units, SF1).
        frac_bits: Fixed-point fractional bits f of the shares.
        tolerance_rate: alpha of the client-side thresholds delta_r^j (SF10); fixed here, as the
            clients fix it before training.
        units: ``gradient`` (G = -delta / eta_l) or ``delta`` (G = -delta).
        seed: Seed of the clients' masks (reproducible tests); None draws fresh OS randomness.
        sharing_id: Id of this sharing, stored in both stores (None: a fresh random one); a
            deployment binds its sessions to it (``binding.sharing_digest``).

    Raises:
        UnsupportedHistoryError: A global model or an accepted client's update is missing.
        ConfigError: Bad arguments, or a value too large for the ring.
        HistoryError: A target store exists already.
    """
    if len(out_dirs) != 2:
        raise ConfigError(f"share_history writes two stores (servers 0 and 1); got {out_dirs!r}")
    if units not in ("gradient", "delta"):
        raise ConfigError(f"units must be 'gradient' or 'delta'; got {units!r}")
    if not lr > 0:
        raise ConfigError(f"lr must be > 0; got {lr!r}")
    scale = -1.0 / lr if units == "gradient" else -1.0
    sharing_id = new_sharing_id() if sharing_id is None else sharing_id
    fixed_point = FixedPoint(frac_bits)
    rounds = history.rounds()
    last = max(rounds) if rounds else 0
    missing = sorted(set(range(last + 1)) - set(rounds))
    if not rounds or missing:
        raise UnsupportedHistoryError(
            f"sharing Stage I needs the global model of every round 0..{last}; missing "
            f"{missing[:10]}. Complete the run first."
        )
    record = StageOneRecord(history, PlainBackend(), scale, tolerance_rate)
    prg = Prg(fresh_seed() if seed is None else derive_seed(b"starfish-stage-one", seed))
    meta = history.meta
    num_params = int(history.read_model(0).numel())
    stores: list[HistoryStore] = []
    infos: list[dict[str, Any]] = []
    manifests = [PayloadManifest(), PayloadManifest()]
    try:
        for party, out in enumerate(out_dirs):
            _private_directory(Path(out))
            info = {
                "sharing_id": sharing_id,
                "party": party,
                "frac_bits": frac_bits,
                "tolerance_rate": tolerance_rate,
                "units": units,
                "scale": scale,
                "num_params": num_params,
                "layout": "uint64 shares of [G (m), ||G||, delta] per accepted upload",
            }
            infos.append(info)
            stores.append(HistoryStore.create(Path(out), {**meta, SHARE_META_KEY: info}))
        for store in stores:
            store.write_round(RoundEntry(round=0, global_model=history.read_model(0)))
        for r in range(1, last + 1):
            records = history.client_records(r)
            shares: list[dict[int, torch.Tensor]] = [{}, {}]
            for rec in records:
                if rec.status != "accepted":
                    continue
                if not history.has_update(r, rec.client_id):
                    raise UnsupportedHistoryError(
                        f"round {r} client {rec.client_id}: accepted but its update is not "
                        "stored; Stage I shares need history.policy=all."
                    )
                gradient = record.plain_update(r, rec.client_id).to(torch.float64)
                norm, threshold = record.assistive(r, rec.client_id)
                vector = np.concatenate([gradient.numpy(), [norm, threshold]])
                StepRanges(frac_bits).check_client_values(vector, f"a round-{r} update")
                encoded = fixed_point.encode(vector)
                mask = prg.ring(encoded.shape)  # the client's uniform r (SecShare, Table IV)
                shares[0][rec.client_id] = torch.from_numpy(mask.copy())
                shares[1][rec.client_id] = torch.from_numpy(encoded - mask)
                for manifest, own in zip(manifests, shares, strict=True):
                    manifest.add(r, rec.client_id, own[rec.client_id])
            public_records = [
                ClientRecord(rec.client_id, rec.status, rec.num_samples, reason=rec.reason)
                for rec in records
            ]
            aggregate = _aggregate_or_none(history, r)
            for store, own in zip(stores, shares, strict=True):
                store.write_round(
                    RoundEntry(
                        round=r,
                        global_model=history.read_model(r),
                        aggregate=aggregate,
                        updates=own,
                        clients=public_records,
                    )
                )
        roots = [manifest.root() for manifest in manifests]
        for store, info, manifest in zip(stores, infos, manifests, strict=True):
            store.update_meta(
                {
                    SHARE_META_KEY: {
                        **info,
                        "payloads": roots,
                        PAYLOAD_DIGESTS_KEY: manifest.to_json(),
                    }
                }
            )
    finally:
        for store in stores:
            store.close()
        for out in out_dirs:
            _private_files(Path(out))


def _private_directory(path: Path) -> None:
    """Create ``path`` readable by its owner only (0700), whatever the umask."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _private_files(path: Path) -> None:
    """Make every file of a share store readable and writable by its owner only (0600)."""
    if not path.is_dir():
        return
    for item in path.iterdir():
        if item.is_file() and not item.is_symlink():
            os.chmod(item, 0o600)


def _aggregate_or_none(history: HistoryReader, round_: int) -> torch.Tensor | None:
    """The round's opened aggregate if the run stored it (public, Sec. IV-D)."""
    try:
        return history.read_model(round_, "aggregate")
    except HistoryCorruptError:
        raise
    except HistoryError:  # not every policy stores aggregates; they are optional here
        return None


def share_meta(history: HistoryReader) -> dict[str, Any]:
    """Return a share store's ``starfish_shares`` metadata, or raise if it is not one."""
    info = run_meta_of(history).extra.get(SHARE_META_KEY)  # a plugin key: passed through
    if not isinstance(info, dict):
        raise UnsupportedHistoryError(
            "this store holds no Starfish Stage I shares (no 'starfish_shares' metadata); "
            "create them with share_history or 'fedunlearn starfish-share RUN'."
        )
    return info


class SharedStageOneRecord:
    """A server's Stage I record: its stored uint64 shares wrapped as ``SharedTensor``s.

    Implements ``steps.StageOneShares`` (``update``, ``norm``, ``threshold``, ``dtype``).

    Every payload read is checked against the SHA-256 bound into the session
    (``binding.PayloadManifest``): a share changed after the handshake is refused.

    Args:
        history: The server's share store (metered).
        party: The server's 2PC party (shares must carry its fixed-point scale).
        sharing: The store's sharing record the session was bound to (``share_meta`` read
            before the handshake); default: read it now.
    """

    def __init__(
        self, history: MeteredHistory, party: Any, sharing: Mapping[str, Any] | None = None
    ) -> None:
        info = share_meta(history) if sharing is None else dict(sharing)
        self.manifest = PayloadManifest.of_sharing(info, party.party_id)
        if int(info["frac_bits"]) != party.fixed_point.frac_bits:
            raise ConfigError(
                f"the share store holds values with {info['frac_bits']} fractional bits; the "
                f"party uses {party.fixed_point.frac_bits}. Set frac_bits={info['frac_bits']}."
            )
        self.history = history
        self.party = party
        self.num_params = int(info["num_params"])
        self.scale = float(info["scale"])
        self.dtype = torch.float64
        self._cached: tuple[tuple[int, int], np.ndarray] | None = None

    def _vector(self, round_: int, client_id: int) -> np.ndarray:
        key = (round_, client_id)
        if self._cached is None or self._cached[0] != key:
            payload = self.history.read_update(round_, client_id)
            self.manifest.check(round_, client_id, payload)
            self._cached = (key, payload.numpy().astype(np.uint64, copy=False))
        return self._cached[1]

    def update(self, round_: int, client_id: int) -> SharedTensor:
        """Return this server's share of [G_r^j]."""
        return self.party.tensor(self._vector(round_, client_id)[: self.num_params].copy())

    def norm(self, round_: int, client_id: int) -> SharedTensor:
        """Return this server's share of [||G_r^j||]."""
        return self.party.tensor(np.array(self._vector(round_, client_id)[self.num_params]))

    def threshold(self, round_: int, client_id: int) -> SharedTensor:
        """Return this server's share of [delta_r^j]."""
        return self.party.tensor(np.array(self._vector(round_, client_id)[self.num_params + 1]))


class PublicClients:
    """The remaining clients as a server knows them: ids, sample counts, training settings.

    Implements ``fedunlearn.fl.clients.RunClients`` in a server process (the context's clients)
    from the run's public data: ids, sizes, ``spec`` and the run seed. It holds no model and
    cannot train (exact updates come through a client gateway as shares): ``model`` and
    ``train`` refuse.
    """

    def __init__(
        self,
        client_ids: Sequence[int],
        sizes: Mapping[int, int],
        spec: LocalTrainingSpec,
        num_params: int,
        seed: int,
    ) -> None:
        self.client_ids: tuple[int, ...] = tuple(client_ids)
        self._sizes = dict(sizes)
        self.spec = spec
        self.num_params = num_params
        self.seed = seed

    @property
    def model(self) -> torch.nn.Module:
        """Refuse: a server holds shares of updates, not the model architecture."""
        raise ConfigError(
            "a Starfish server holds no model (only shares of updates); run methods that "
            "need the architecture in-process"
        )

    def num_samples(self, client_id: int) -> int:
        """n_c of a client (public: FedAvg weights)."""
        return self._sizes[client_id]

    def train(self, task: TrainTask) -> list[ClientUpdate]:
        """Refuse: a server never trains on client data."""
        raise ConfigError("a Starfish server cannot train clients; use the client gateway")


def server_context(
    history: MeteredHistory, config: RunConfig, forget: frozenset[int], meter: CostMeter
) -> UnlearnContext:
    """Return the ``UnlearnContext`` of a server process: share store, public data only.

    Args:
        history: The server's share store, metered.
        config: The run's public configuration.
        forget: The clients to remove.
        meter: Cost meter of this server.
    """
    sizes = run_meta_of(history).sizes()
    if not sizes:
        raise UnsupportedHistoryError("the share store has no client sizes in its metadata")
    unknown = sorted(forget - set(sizes))
    if unknown:
        raise ConfigError(
            f"client(s) {unknown} are not in this run (client ids {min(sizes)}..{max(sizes)})"
        )
    info = share_meta(history)
    training = config.training
    spec = LocalTrainingSpec(
        epochs=training.local_epochs,
        lr=training.lr,
        batch_size=training.batch_size,
    )
    remaining = [c for c in sorted(sizes) if c not in forget]
    num_rounds = max(history.rounds())
    if num_rounds != training.rounds:
        raise UnsupportedHistoryError(
            f"the share store holds {num_rounds} of {training.rounds} rounds; share a finished run"
        )
    return UnlearnContext(
        history=history,
        clients=PublicClients(remaining, sizes, spec, int(info["num_params"]), config.seed),
        aggregator=fedavg,
        num_rounds=num_rounds,
        initial_params=history.read_model(0),
        final_model=history.read_model(num_rounds),
        meter=meter,
        training=TrainingInfo(training.participation, training.aggregator.name),
        recording=config.history,
        privacy=config.privacy,
    )
