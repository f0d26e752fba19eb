"""Checking a store for damage: ``check()`` and ``verify()``, and the advice on how to repair.

``Integrity`` holds the ``HistoryStore`` methods that look for damage without changing anything.
It is mixed into ``HistoryStore`` (``sqlite``) and uses that class's connection and helpers.
The repair itself is the run directory's (``fedunlearn.runs.train``: ``--resume --repair``
drops the first bad round and later and retrains them).
"""

from __future__ import annotations

from fedunlearn.errors import HistoryCorruptError
from fedunlearn.history.store.codec import NO_CLIENT
from fedunlearn.history.store.host import StoreMixin
from fedunlearn.history.store.records import StoreCheck, format_ids

__all__ = ["Integrity"]

_CHECK_SAMPLE = 20  # problems listed by check()


class Integrity(StoreMixin):
    """``HistoryStore``'s checking methods (a mixin: see the module docstring)."""

    def check(self, *, full: bool = True) -> StoreCheck:
        """Look for damage and inconsistencies without changing anything.

        Checks, in order: SQLite's structure (``PRAGMA quick_check``, full only); the metadata
        (a JSON object, matching the checksum written with it: ``meta_problem``);
        that the rounds are 0..last without gaps and round 0 holds M_0; the catalog (each
        payload's byte count, each stored update has an accepted or rejected client record,
        nothing stored of a forgotten client); and the checksum, size, dtype and shape of every
        payload (full) or of the global models and aggregates only (quick); and the committed
        history (``check_chain``: every stored round, participant, payload hash, deletion record
        and event against the hash chain). Reads one payload at a time.

        Args:
            full: Read every payload; False for a quick check (catalog and models).

        Returns:
            What was found, with the first bad round (retrain from the round before it).
        """
        bad: list[tuple[int | None, str]] = []
        with self._sqlite("checking the store"):
            if full:
                structure = [row[0] for row in self._db.execute("PRAGMA quick_check")]
                if structure != ["ok"]:
                    bad.append((None, "structure: " + "; ".join(structure[:3])))
            try:
                changed = self.meta_problem()  # the metadata against its checksum
            except HistoryCorruptError:
                bad.append((None, "metadata: missing or not a JSON object"))
            else:
                if changed:
                    bad.append((None, changed))
            rounds = self.rounds()
            if rounds and rounds != list(range(rounds[-1] + 1)):
                gaps = sorted(set(range(rounds[-1] + 1)) - set(rounds))
                if gaps:
                    bad.append((gaps[0], f"rounds {format_ids(gaps)} are missing"))
                else:  # numbers out of order, repeated or negative: a damaged table
                    bad.append((None, f"the rounds table lists rounds {rounds[:8]}..."))
            if (
                rounds
                and self._payload_row("round=0 AND kind='global' AND client_id=?", (NO_CLIENT,))
                is None
            ):
                bad.append((0, "round 0 has no initial model M_0"))
            for round, kind, cid, size, length in self._db.execute(
                "SELECT round, kind, client_id, size_bytes, length(data) FROM payloads "
                "WHERE size_bytes != length(data) OR typeof(data) != 'blob'"
            ):
                bad.append(
                    (
                        round,
                        f"round {round} {self._what(kind, cid)}: has {length} bytes, not {size}",
                    )
                )
            for round, cid, status, gone in self._db.execute(
                "SELECT p.round, p.client_id, c.status, c.forgotten_at FROM payloads p LEFT JOIN "
                "clients c ON c.round=p.round AND c.client_id=p.client_id WHERE p.kind='update' "
                "AND (c.status IS NULL OR c.status='missing' OR c.forgotten_at IS NOT NULL "
                "OR p.client_id IN (SELECT client_id FROM forget_log))"
            ):
                why = "forgotten" if gone is not None else f"its record says {status or 'nothing'}"
                bad.append((round, f"round {round} client {cid}: an update is stored but {why}"))
            catalog = self._db.execute(
                "SELECT id, round, kind, client_id, size_bytes FROM payloads"
                + ("" if full else " WHERE kind != 'update'")
                + " ORDER BY round, kind, client_id"
            ).fetchall()
        checked = checked_bytes = 0
        for pid, round, kind, cid, size in catalog:
            try:
                self._decode(self._payload_row("id=?", (pid,)))
                checked += 1
                checked_bytes += size
            except HistoryCorruptError as err:
                reason = str(err).split(f"{self._what(kind, cid)} ", 1)[-1].split(";")[0]
                bad.append((round, f"round {round} {self._what(kind, cid)}: {reason}"))
        chain = self.check_chain(full=full)  # the committed history (chain.py)
        bad += [(r, f"chain: {line}") for r, line in chain.problems]
        bad.sort(key=lambda b: (b[0] is not None, b[0] if b[0] is not None else 0))
        first = min((r for r, _ in bad if r is not None), default=None)
        return StoreCheck(
            ok=not bad,
            full=full,
            payloads_checked=checked,
            bytes_checked=checked_bytes,
            problems=tuple(msg for _, msg in bad[:_CHECK_SAMPLE])
            + ((f"... and {len(bad) - _CHECK_SAMPLE} more",) if len(bad) > _CHECK_SAMPLE else ()),
            first_bad_round=first,
            chain=chain.to_dict(),
        )

    def verify(self) -> None:
        """Check the file's structure, the catalog and every payload's checksum (``check()``).

        Raises:
            HistoryCorruptError: Naming the damage, the first bad round and how to repair.
        """
        result = self.check(full=True)
        if not result.ok:
            raise HistoryCorruptError(
                f"{self._file}: {'; '.join(result.problems[:5])}"
                f"{'; ...' if len(result.problems) > 5 else ''}; nothing was changed. "
                f"{self._repair_advice(result.first_bad_round)}"
            )

    def _repair_advice(self, round: int | None) -> str:
        """Say how to recover from damage starting at ``round`` (None: not tied to a round)."""
        if round is None:
            return "Restore the file from a backup, or start a new run."
        run = self._file.parent.parent
        return (
            f"To retrain from round {max(round - 1, 0)}: fedunlearn train {run}/config.yaml "
            f"--out {run} --resume --repair (drops round {round} and later), or restore the "
            "file from a backup."
        )
