"""Benchmark how fast ``fedunlearn --help`` and ``--version`` answer, and what they import.

Runs each command ``--repeats`` times in a fresh interpreter (``python -m fedunlearn.cli.main``)
and prints the median wall time, next to the median time of ``python -c "import torch"`` measured
in the same loop (interleaved), which is what the CLI used to pay before answering. Also reports
whether torch was imported (``-X importtime``) and the five slowest imports of ``--help``.

    python benchmarks/bench_cli_startup.py --repeats 7
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "--help": [sys.executable, "-m", "fedunlearn.cli.main", "--help"],
    "--version": [sys.executable, "-m", "fedunlearn.cli.main", "--version"],
    "train --help": [sys.executable, "-m", "fedunlearn.cli.main", "train", "--help"],
    "import torch (reference)": [sys.executable, "-c", "import torch"],
}


def timed(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "COLUMNS": "100"})
    return time.perf_counter() - started


def imports(cmd: list[str]) -> tuple[bool, list[tuple[str, float]]]:
    """Return whether torch was imported and the slowest top-level imports (name, seconds)."""
    done = subprocess.run(
        [cmd[0], "-X", "importtime", *cmd[1:]], capture_output=True, text=True, check=True
    )
    rows = []
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = (part.strip() for part in line.split("|"))
        if cumulative.isdigit() and not name.startswith(" "):
            rows.append((name, int(cumulative) / 1e6))
    loaded = any(name.strip() == "torch" for name, _ in rows)
    return loaded, sorted(rows, key=lambda r: -r[1])[:5]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.repeats):  # interleaved, so every command sees the same load
        for name, cmd in COMMANDS.items():
            times[name].append(timed(cmd))
    torch_loaded, slowest = imports(COMMANDS["--help"])
    out = {
        "python": platform.python_version(),
        "load_average": os.getloadavg()[0],
        "repeats": args.repeats,
        "median_seconds": {name: statistics.median(t) for name, t in times.items()},
        "max_seconds": {name: max(t) for name, t in times.items()},
        "help_imports_torch": torch_loaded,
        "help_slowest_imports_seconds": slowest,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
