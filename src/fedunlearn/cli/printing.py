"""What the commands print with: the consoles, tables, the comparison's tables, privacy lines.

Piped output is never wrapped at 80 columns (``soft_wrap``); a table is boxed on a terminal and
Markdown when piped (``print_table``).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

__all__ = [
    "GUARANTEE_SHORT",
    "console",
    "err_console",
    "headline_epsilon",
    "human_bytes",
    "print_results",
    "print_table",
]

console = Console(soft_wrap=True)  # piped output: no line breaks at 80 columns
err_console = Console(stderr=True)


def human_bytes(value: float | None) -> str:
    """``value`` bytes in B, kB, MB or GB, three significant digits ("-" for None)."""
    if value is None:
        return "-"
    for unit in ("B", "kB", "MB"):
        if value < 1000:
            return f"{value:.3g} {unit}"
        value /= 1000
    return f"{value:,.3g} GB" if value < 1000 else f"{value:,.0f} GB"


def print_table(title: str, header: list[str] | None, rows: list[list[str]]) -> None:
    """Print a table: boxed on a terminal, Markdown (never wrapped) when piped.

    ``header`` None makes a two-column key-value table.
    """
    if console.is_terminal:
        from rich.table import Table

        table = Table(title=title, show_header=header is not None)
        for i, col in enumerate(header or ["", ""]):
            table.add_column(col, justify="right" if header and i else "left")
        for row in rows:
            table.add_row(*row)
        console.print(table)
        return
    cols = header or ["field", "value"]
    lines = [title, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    print("\n".join(lines))


def print_results(doc: dict[str, Any]) -> None:
    """Print a comparison's table of methods and its table of costs (``compare``, ``demo``)."""
    from fedunlearn.report.tables import COST_NOTE, cost_rows, shared_receipt_seconds, table_rows

    header, rows = table_rows(doc, compact=True)
    print_table(f"{doc['request']['kind']} clients {doc['request']['forget']}", list(header), rows)
    header, rows = cost_rows(doc)
    print_table("costs (this machine, this run)", header, rows)
    shared = shared_receipt_seconds(doc)
    console.print(
        COST_NOTE
        + (f" Shared references: {shared:.1f} s." if shared is not None else "")
        + f" The comparison took {doc['wall_seconds']:.1f} s in all.",
        highlight=False,
    )


#: What one unit of ε protects, per ``privacy.mechanism`` (the ledger's ``guarantee`` says more).
GUARANTEE_SHORT = {
    "dp_sgd": "eps per training example (replace-one), not per client",
    "client_update": "eps per client and round (replace one client's data)",
}


def headline_epsilon(guarantee: float | None, realised: float | None, delta: float) -> str:
    """The guarantee first (a priori), the realised schedule's total beside it, labelled."""
    first = "guarantee eps -" if guarantee is None else f"guarantee eps {guarantee:.3f}"
    second = (
        "" if realised is None else f"; realised {realised:.3f} (data-dependent, not a guarantee)"
    )
    return f"{first} (a priori, replace-one) at delta {delta:g}{second}"
