"""What the CLI shows of receipts: verdicts and reasons, progress.

``print_verification`` prints one receipt (the influence, utility and store verdicts and the
lineage, why the influence verdict is what it is, then a line per check with its reason);
``print_verdicts`` prints each method of a comparison the same way, and the cheapest method shown
to remove the influence with utility ok; ``exit_code`` and ``comparison_exit_code`` give the
documented exit codes (1 when the influence remains); ``RoundProgress`` draws progress per
method and per unlearning round. The receipt options (``--thresholds``, ...) are
``cli.options``; ``fedunlearn audit`` is ``cli.commands.audit``. The checks themselves:
docs/verification.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

__all__ = [
    "LEGEND",
    "RoundProgress",
    "comparison_exit_code",
    "distance_text",
    "exit_code",
    "influence_line",
    "print_verdicts",
    "print_verification",
]

console = Console()
err_console = Console(stderr=True)

_STYLE = {
    "pass": "bold green",
    "warn": "bold yellow",
    "fail": "bold red",
    "inconclusive": "yellow",
    "n/a": "dim",
    "removed": "bold green",
    "not_detected": "bold cyan",
    "not_shown": "bold yellow",
    "remains": "bold red",
}
_MARK = {
    "pass": "PASS",
    "warn": "WARN",
    "fail": "FAIL",
    "inconclusive": "INCONCLUSIVE",
    "n/a": "n/a ",
    "removed": "REMOVED",
    "not_detected": "NOT DETECTED",
    "not_shown": "NOT SHOWN",
    "remains": "REMAINS",
}

LEGEND = (
    "none: the original model (no unlearning). retrain: retraining from scratch without the "
    "removed clients, the reference. TA: test accuracy. ASR: share of triggered test inputs the "
    "model classifies as the backdoor's target (Retrain shows the clean level). MIA: "
    "membership-attack AUC on the forgotten clients' clean training data against unseen data "
    "(0.5: the attack cannot tell). L2 retrain: parameter distance to the retrained model. "
    "client epochs: local epochs the method asked of the clients (Retrain's is the price of "
    "exact unlearning). verdict: the receipt's influence verdict (removed: by construction, "
    "an exact lineage; not_detected: no check with power flags it, down to its detection limit; "
    "not_shown; remains) and utility (docs/verification.md)."
)


def verdict_text(verdict: str) -> str:
    """Return a verdict as rich markup (``PASS`` in green, ...)."""
    return f"[{_STYLE.get(verdict, '')}]{_MARK.get(verdict, verdict).strip()}[/]"


def influence_line(verification: Mapping[str, Any]) -> str:
    """Return the receipt's summary: influence (rich markup), utility, store and lineage."""
    influence = verification.get("influence", "not_shown")
    lineage = verification.get("lineage")
    lineage_text = "no lineage" if not lineage else f"lineage {lineage.get('kind')}"
    return (
        f"influence {verdict_text(influence)}, utility {verification.get('utility', 'unknown')}, "
        f"store {verification.get('store', 'unknown')}, {lineage_text}"
    )


_SHARES = frozenset({"backdoor", "markers", "poisoning", "utility"})
_REFERENCE_NAMES = (
    ("retrain", "Retrain"),
    ("clean_measured", "M_0"),
    ("chance", "chance"),
    ("original", "original"),
)


def _number(name: str, value: Any) -> str:
    if not isinstance(value, int | float):
        return "n/a" if value is None else str(value)
    return f"{100 * value:.1f}%" if name in _SHARES else f"{value:.3g}"


def check_line(check: Mapping[str, Any]) -> str:
    """One line of a check from its numbers (no prose): mark, title, value, interval, refs."""
    name, verdict = check["name"], check["verdict"]
    parts = [f"[{_STYLE[verdict]}]{_MARK[verdict].strip()}[/] {check['title']}"]
    if check.get("value") is not None and check["aspect"] != "store":
        text = _number(name, check["value"])
        decided = (check.get("evidence") or {}).get("decided_by")
        if name == "membership" and decided:  # which attack's AUC the figures are
            text = f"{decided} attack AUC {text}"
        interval = (check.get("evidence") or {}).get("interval")
        if interval:
            text += (
                f" [{_number(name, interval['low'])}, {_number(name, interval['high'])}; "
                f"n={interval['n']}]"
            )
        refs = check.get("reference") or {}
        shown = [
            f"{label} {_number(name, refs[key])}"
            for key, label in _REFERENCE_NAMES
            if isinstance(refs.get(key), int | float)
        ]
        toward = (check.get("evidence") or {}).get("toward_original")
        relative = check["value"]
        if (
            name == "distance"
            and isinstance(toward, int | float)
            and isinstance(relative, int | float)
        ):
            line = (check.get("threshold") or {}).get("toward")
            text = distance_text(relative, toward, line)
            shown = []
        parts.append(text + (f" ({', '.join(shown)})" if shown else ""))
    elif check["aspect"] == "store" and check.get("value"):
        parts.append(f"{int(check['value']):,} update bytes held")
    codes = check.get("codes") or []
    if codes:
        parts.append("/".join(codes))
    return ": ".join(parts[:2]) + (f" - {parts[2]}" if len(parts) > 2 else "")


def distance_text(relative: float, toward: float, line: float | None = None) -> str:
    """The distance check's figures, saying why the two can disagree (one line).

    ``relative``: the model's distance to Retrain over the original's; ``toward``: its share of
    the original's offset, the projection onto original - Retrain; the rest is across that
    direction (``eval.receipt.rules.distance.across``), so a model keeping little of the offset
    can still lie farther from Retrain than the original.
    """
    from fedunlearn.eval.receipt.rules.distance import across

    return (
        f"{relative:.2f}x the original's distance = {toward:.2f} along the original's offset "
        f"from Retrain"
        + (f" (exact retrains below {line:.2f})" if isinstance(line, int | float) else "")
        + f" and {across(relative, toward):.2f} across it"
    )


def _limit_text(verification: Mapping[str, Any]) -> str:
    limit = verification.get("detection_limit") or {}
    if limit.get("lambda") is None:
        return ""
    return f" (detection limit: lambda {limit['lambda']:.2f} of the original's offset)"


def client_line(entry: Mapping[str, Any]) -> str:
    """One line of a forgotten client's entry: its verdicts and, if earlier, who removed it."""
    text = (
        f"client {entry['client']} ({entry['request']}, {entry['role']}): influence "
        f"{verdict_text(entry['influence'])}, store {entry['store'].get('status')}"
    )
    by = entry.get("removed_by")
    if by:
        text += (
            f" (removed by generation {by['generation']}, {by['method']}; its receipt sha256 "
            f"{(by.get('receipt_sha256') or 'none')[:12]})"
        )
    return text


def _deciding(verification: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The checks the verdicts rest on: the influence's; utility, store, method ones that warn."""
    names = set(verification.get("deciding") or [])
    return [
        c
        for c in verification["checks"]
        if c["name"] in names or (c["aspect"] != "influence" and c["verdict"] in ("warn", "fail"))
    ]


def print_verification(
    verification: Mapping[str, Any],
    *,
    title: str = "",
    out: Console | None = None,
    explain: bool = False,
) -> None:
    """Print a receipt: its verdicts, then one line per check that decides them.

    ``explain``: the influence's reason, every check with its reason, every forgotten client.
    """
    out = out or console
    refs = ", ".join(verification.get("references", ()))
    head = title or verification.get("subject", "") or "model"
    out.print(
        f"{head}: {influence_line(verification)}{_limit_text(verification)} (references: {refs})",
        highlight=False,
    )
    if not explain:
        for check in _deciding(verification):
            out.print(f"  {check_line(check)}", highlight=False)
        entries = verification.get("clients") or []
        if any(e["request"] == "earlier" for e in entries):  # a living run: every client
            for entry in entries:
                out.print(f"  {client_line(entry)}", highlight=False)
        return
    if verification.get("influence_reason"):
        out.print(f"  influence: {verification['influence_reason']}", highlight=False)
    for check in verification["checks"]:
        verdict = check["verdict"]
        out.print(
            f"  [{_STYLE[verdict]}]{_MARK[verdict]}[/] {check['title']}: {check['reason']}",
            highlight=False,
        )
    for assumption in verification.get("assumptions") or []:  # what no check can see
        out.print(f"  assumes: {assumption}", highlight=False)
    for entry in verification.get("clients") or []:  # a living run: every forgotten client
        out.print(
            f"  client {entry['client']} ({entry['request']}, {entry['role']}): influence "
            f"{verdict_text(entry['influence'])}, store {entry['store'].get('status')}: "
            f"{entry['influence_reason']}",
            highlight=False,
        )


def print_verdicts(
    doc: Mapping[str, Any], *, out: Console | None = None, explain: bool = False
) -> None:
    """Print each method's verdicts (one line) and its deciding checks (one line each).

    ``explain``: the influence's reason and the reason of every check that did not pass.
    """
    out = out or console
    for row in doc["methods"]:
        verification = row.get("verification")
        if verification is None:
            continue
        name = row.get("label", row["method"])
        out.print(f"{name}: {influence_line(verification)}{_limit_text(verification)}")
        if explain:
            if verification.get("influence_reason"):
                out.print(f"  - influence: {verification['influence_reason']}", highlight=False)
            for reason in verification.get("reasons", []):
                out.print(f"  - {reason}", highlight=False)
            continue
        for check in _deciding(verification):
            out.print(f"  {check_line(check)}", highlight=False)
    from fedunlearn.report.tables import cheapest_passing

    best = cheapest_passing(doc)
    retrain = next((m for m in doc["methods"] if m["method"] == "retrain"), None)
    if best is None:
        out.print("[bold red]No method's influence was removed or not detected with utility ok.[/]")
    elif retrain is not None and best["method"] != "retrain":
        out.print(
            "Cheapest method whose influence is removed or not detected, with utility ok: "
            f"[bold]{best.get('label', best['method'])}"
            f"[/] ({best['client_epochs']:,} client epochs against Retrain's "
            f"{retrain['client_epochs']:,})",
            highlight=False,
        )
    else:
        out.print(
            "Only Retrain (removed by construction) qualifies: the cheaper methods left a "
            "trace or could not be judged (--explain says why)."
        )


def exit_code(verification: Mapping[str, Any]) -> int:
    """Return the exit code of a receipt: 1 when the influence remains, else 0."""
    return 1 if verification.get("influence") == "remains" else 0


def comparison_exit_code(doc: Mapping[str, Any]) -> int:
    """Return 1 when any method other than the ``none`` control leaves the influence, else 0."""
    for row in doc["methods"]:
        verification = row.get("verification")
        if row["method"] != "none" and verification is not None and exit_code(verification):
            return 1
    return 0


class RoundProgress:
    """Progress of unlearning: the current method, its round count and latest metrics.

    Implements ``fedunlearn.experiments.Progress``; use as a context manager.
    """

    def __init__(self, out: Console | None = None, *, enabled: bool = True) -> None:
        console = out or err_console
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            console=console,
            disable=not (enabled and console.is_terminal),  # no live display in logs and pipes
            transient=True,
        )
        self._task = self._progress.add_task("starting", total=None, status="")
        self._rounds = 0
        self._current: str | None = None

    def __enter__(self) -> RoundProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self._finish()
        self._progress.stop()

    def on_step(self, text: str) -> None:
        """Show a stage without rounds."""
        self._finish()
        self._progress.update(self._task, description=text, status="")

    def on_method(self, name: str, index: int, total: int) -> None:
        """Show that method ``index`` of ``total`` starts (and that the previous one is done)."""
        self._finish()
        self._rounds = 0
        self._current = name
        self._progress.update(self._task, description=f"[{index}/{total}] {name}", status="")

    def _finish(self) -> None:
        if self._current is not None:
            self._progress.console.print(
                f"  {self._current}: done ({self._rounds} unlearning rounds)", style="dim"
            )
            self._current = None

    def on_round(self, name: str, metrics: dict[str, float]) -> None:
        """Show one more finished unlearning round and its test metrics."""
        self._rounds += 1
        text = f"round {self._rounds}"
        if "test_accuracy" in metrics:
            text += f"  acc {metrics['test_accuracy']:.3f}"
        if "backdoor_asr" in metrics:
            text += f"  asr {metrics['backdoor_asr']:.3f}"
        self._progress.update(self._task, status=text)
