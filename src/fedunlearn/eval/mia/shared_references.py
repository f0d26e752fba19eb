"""The client-level test's references trained once per run generation, shared by every request.

``fit_client_membership`` trains its references for one request: "out" ones without the
forgotten clients, "in" ones with them (``DEFAULT_NUM_REFERENCE``, about 8 Retrains' client
epochs per request). ``shared_client_test`` uses LiRA's online design instead (Carlini et al.,
"Membership Inference Attacks From First Principles", IEEE S&P 2022, Sec. IV-A and Alg. 1:
shadow models on random halves of the data, so every record is "in" about half of them and
"out" of the others): ``num_reference`` references, in complementary pairs, each trained on a
random half of the run's clients (the run's rounds, participants, local training and
aggregation, its M_0, other batch orders). For one client every pair gives exactly one "in"
and one "out" reference; for a request of several clients, a reference is "in" when it holds
all of them and "out" when it holds none. The test is then calibrated exactly as per request
(``client_lira.build_client_test``: the same statistic, Gaussians, leave-one-out, Student-t
threshold at ``target_fpr`` and power on the "in" references), with these references.

The set is trained by the first request of a generation and kept in the run directory
(``receipt_references/``), keyed by the run's fingerprint (config, generation, last round),
its forgotten clients, the seed and the count; its manifest holds the SHA-256 of the
parameters' file, and a file that does not match is refused (and trained again). An ``apply``
or ``train --continue`` changes the key: the next request trains a new set and the stale files
are removed. The receipt's cost states what this request paid: the first pays the training,
the later ones 0 client epochs (a forward pass per model); ``notes["shared_references"]``
holds the one-time cost, so an amortised figure can be stated.

Deviations:
    [REC] The references train on half the clients, the scored models (the original, Retrain)
    on all or all but the forgotten ones: they are fitter than the references, the region
    ``above`` of the fitness range (``eval.receipt.rules.client_membership``), where the flag
    line grows with the clean controls' scores (Retrain continued). LiRA's online attack
    scores a target trained on a random half too; here the target cannot be.
    [REC] A request whose clients the halves split too often (fewer than
    ``MIN_PER_SIDE_FOR_RANGE`` "in" or "out" references hold all or none of them) is not
    tested with the shared set: ``shared_client_test`` returns None and the caller fits the
    per-request test.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from fedunlearn.errors import ConfigError
from fedunlearn.eval.mia.client_lira import (
    MIN_PER_SIDE_FOR_RANGE,
    ClientMembershipTest,
    _Budget,
    _run_participants,
    _SaltedClients,
    _train_reference,
    build_client_test,
)
from fedunlearn.fl.seeding import derive_seed
from fedunlearn.runs.rundir import REFERENCES_CACHE_DIR, write_bytes_atomic, write_json
from fedunlearn.unlearn import UnlearnRequest, UnlearnSession

__all__ = [
    "DEFAULT_SHARED_REFERENCES",
    "SharedReferences",
    "load_or_train_shared",
    "shared_client_test",
]

DEFAULT_SHARED_REFERENCES = 6  # 3 complementary pairs: 3 "in" + 3 "out" per client
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class SharedReferences:
    """One run generation's shared references.

    Attributes:
        params: Each reference's flat parameters.
        members: The clients each reference trained with.
        client_epochs: What training the set cost (once).
        seconds: Its wall time.
        cached: Read from the run directory (this request trained nothing).
        note: What happened to the cache (refused, unwritable), or "".
    """

    params: tuple[torch.Tensor, ...]
    members: tuple[frozenset[int], ...]
    client_epochs: float
    seconds: float
    cached: bool
    note: str = ""

    def sides(self, forgotten: frozenset[int]) -> list[tuple[str, torch.Tensor]]:
        """``("in" | "out", params)`` of every reference that holds all or none of them."""
        out = []
        for params, members in zip(self.params, self.members, strict=True):
            if forgotten <= members:
                out.append(("in", params))
            elif not forgotten & members:
                out.append(("out", params))
        return out


def _key(session: UnlearnSession, count: int, seed: int) -> str:
    run = session.run_view
    text = json.dumps(
        {
            "fingerprint": run.fingerprint,
            "generation": run.generation,
            "rounds": run.num_rounds,
            "forgotten": sorted(run.forgotten),
            "seed": seed,
            "count": count,
        },
        sort_keys=True,
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _halves(clients: Sequence[int], count: int, seed: int) -> list[frozenset[int]]:
    """``count`` members sets in complementary pairs of seeded random halves of ``clients``."""
    out: list[frozenset[int]] = []
    for pair in range(count // 2):
        g = torch.Generator().manual_seed(derive_seed(seed, "client_lira_shared_halves", pair))
        order = [clients[i] for i in torch.randperm(len(clients), generator=g).tolist()]
        half = frozenset(order[: len(order) // 2])
        out += [half, frozenset(clients) - half]
    return out


def _train(
    session: UnlearnSession,
    count: int,
    seed: int,
    max_seconds: float,
    step: Callable[[str], None] | None,
) -> SharedReferences | None:
    """Train the set; None when the budget ran out before every reference finished."""
    rounds = _run_participants(session)
    clients = sorted(set().union(*rounds)) if rounds else []
    if len(clients) < 2:
        return None
    budget = _Budget(max_seconds)
    any_client = UnlearnRequest.of([clients[0]])
    aggregator = session.context(any_client).aggregator
    params, members, epochs = [], [], 0.0
    for j, half in enumerate(_halves(clients, count, seed)):
        if step is not None:
            step(f"client-level test: shared reference {j + 1}/{count} (once per generation)")
        salt = derive_seed(seed, "client_lira_shared", j)
        trained = _train_reference(
            _SaltedClients(session.federation, salt),
            session.run_view.initial_params,
            rounds,
            aggregator,
            frozenset(clients) - half,
            budget,
        )
        if trained is None:
            return None
        params.append(trained[0].to(torch.float32))
        members.append(half)
        epochs += trained[1]
    return SharedReferences(tuple(params), tuple(members), epochs, budget.elapsed(), False)


def _read(folder: Path, key: str) -> tuple[SharedReferences | None, str]:
    """The cached set of ``key``; (None, why) when absent, stale or refused."""
    manifest = folder / MANIFEST
    if not manifest.exists():
        return None, ""
    try:
        meta = json.loads(manifest.read_text())
        if meta.get("key") != key:
            return None, ""
        blob = (folder / meta["file"]).read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return None, "the shared references' cache was unreadable: trained again"
    if hashlib.sha256(blob).hexdigest() != meta.get("sha256"):
        return None, (
            "the shared references' cache does not match its SHA-256 (edited or damaged): "
            "refused and trained again"
        )
    data = torch.load(io.BytesIO(blob), weights_only=True)
    return SharedReferences(
        tuple(data["params"].unbind(0)),
        tuple(frozenset(int(c) for c in m) for m in meta["members"]),
        float(meta["client_epochs"]),
        float(meta["seconds"]),
        True,
    ), ""


def _write(folder: Path, key: str, refs: SharedReferences) -> str:
    """Keep ``refs`` under ``key`` (removing any other generation's); a note if it failed."""
    buffer = io.BytesIO()
    torch.save({"params": torch.stack(refs.params)}, buffer)
    blob = buffer.getvalue()
    name = f"{key[:16]}.pt"
    try:
        folder.mkdir(exist_ok=True)
        for stale in folder.glob("*.pt"):
            if stale.name != name:
                stale.unlink()
        write_bytes_atomic(folder / name, blob)
        write_json(
            folder / MANIFEST,
            {
                "key": key,
                "file": name,
                "sha256": hashlib.sha256(blob).hexdigest(),
                "members": [sorted(m) for m in refs.members],
                "client_epochs": refs.client_epochs,
                "seconds": refs.seconds,
            },
        )
    except OSError as err:
        return f"the shared references were not kept ({err.strerror or err}): trained per run"
    return ""


def load_or_train_shared(
    session: UnlearnSession,
    *,
    count: int = DEFAULT_SHARED_REFERENCES,
    seed: int = 0,
    max_seconds: float = float("inf"),
    step: Callable[[str], None] | None = None,
) -> SharedReferences | None:
    """Return this generation's shared references: from the run directory, or trained now.

    Args:
        session: The opened run.
        count: References to train (an even number >= 4: complementary pairs).
        seed: Seed of the halves and of the references' batch orders.
        max_seconds: Wall-time budget of the training (a set cut short is not kept).
        step: Told which reference is training.

    Returns:
        The set, or None when it could not be trained within ``max_seconds``.

    Raises:
        ConfigError: for an odd ``count`` or one below 4.
    """
    if not isinstance(count, int) or count < 4 or count % 2:
        raise ConfigError(f"shared references must be an even int >= 4; got {count!r}")
    key = _key(session, count, seed)
    folder = session.run_view.run_dir / REFERENCES_CACHE_DIR
    cached, note = _read(folder, key)
    if cached is not None:
        return cached
    refs = _train(session, count, seed, max_seconds, step)
    if refs is None:
        return None
    kept = _write(folder, key, refs)
    return SharedReferences(
        refs.params, refs.members, refs.client_epochs, refs.seconds, False, note or kept
    )


def shared_client_test(
    session: UnlearnSession,
    forget: Sequence[int],
    *,
    count: int = DEFAULT_SHARED_REFERENCES,
    target_fpr: float = 0.05,
    seed: int = 0,
    max_seconds: float = float("inf"),
    step: Callable[[str], None] | None = None,
) -> ClientMembershipTest | None:
    """The client-level test of ``forget`` calibrated on this generation's shared references.

    Returns:
        The test (its cost: the set's training when this request trained it, else 0 client
        epochs and the scoring's wall time), or None when the shared set gives fewer than
        ``MIN_PER_SIDE_FOR_RANGE`` "in" or "out" references for these clients, or could not
        be trained in ``max_seconds``: the caller fits the per-request test.
    """
    began = time.perf_counter()
    forgotten = frozenset(int(c) for c in forget)
    session.run_view.check_request(UnlearnRequest.of(sorted(forgotten)))
    refs = load_or_train_shared(session, count=count, seed=seed, max_seconds=max_seconds, step=step)
    if refs is None:
        return None
    sides = refs.sides(forgotten)
    labels = [side for side, _ in sides]
    if min(labels.count("in"), labels.count("out")) < MIN_PER_SIDE_FOR_RANGE:
        return None
    paid = 0.0 if refs.cached else refs.client_epochs
    notes: dict[str, object] = {
        "references": "shared",
        "shared_references": {
            "count": count,
            "client_epochs": refs.client_epochs,
            "seconds": refs.seconds,
            "cached": refs.cached,
            **({"note": refs.note} if refs.note else {}),
        },
        "skipped": False,
        "budget_exhausted": False,
    }
    return build_client_test(
        session,
        forgotten,
        sides,
        target_fpr=target_fpr,
        seed=seed,
        cost_seconds=time.perf_counter() - began,
        cost_client_epochs=paid,
        notes=notes,
    )
