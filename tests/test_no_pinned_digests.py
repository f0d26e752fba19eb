"""No test compares a model or payload with a digest recorded on another machine (issue 42).

float32 kernels round differently on different CPUs (the same torch wheel runs AVX-512 kernels on
one Xeon and AVX2 kernels on an EPYC), so the SHA-256 of a trained model is a fact about one
machine. The project's promise is "bit-identical on the same machine and device": a test that
needs "the same result as before" computes both sides where it runs. This test fails on any
64-hex-digit literal (a SHA-256) in the test, benchmark and reproduction code. A digest of a
fixture the test itself writes (bytes fixed by the test, not by a CPU's rounding) may stay when
its line says so with the marker comment ``# fixture digest``.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("tests", "benchmarks", "reproductions")
HEX64 = re.compile(r"(?<![0-9a-fA-F])[0-9a-fA-F]{64}(?![0-9a-fA-F])")
MARKER = "# fixture digest"


def pinned_digests(source: str) -> list[tuple[int, str]]:
    """Return (line, literal) for each string literal holding a 64-hex digest without the marker."""
    lines = source.splitlines()
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.STRING:
            continue
        match = HEX64.search(token.string)
        if match is None:
            continue
        first, last = token.start[0], token.end[0]
        if any(MARKER in lines[n - 1] for n in range(first, last + 1)):
            continue
        found.append((first, match.group()[:12]))
    return found


def _files() -> list[Path]:
    here = Path(__file__).resolve()
    return sorted(
        p
        for folder in SCANNED
        if (ROOT / folder).is_dir()
        for p in (ROOT / folder).rglob("*.py")
        if p.resolve() != here
    )


def test_the_scanner_finds_a_pinned_digest_and_honours_the_marker():
    digest = "a85cd60cdaba346af5665d25300de6157f72d60d6e9a27f736d5e8a528c06995"
    pinned = f'EXPECTED = {{"crab": "{digest}"}}\n'
    marked = f'FIXTURE = "{digest}"  {MARKER}: bytes written by this test\n'
    prose = "# a comment naming a85cd60c... is not a literal\nx = 'abc'\n"
    assert pinned_digests(pinned) == [(1, digest[:12])]
    assert pinned_digests(marked) == []
    assert pinned_digests(prose) == []
    assert pinned_digests(f'X = "{digest}0"\n') == []  # 65 digits: not a SHA-256


def test_no_digest_recorded_on_another_machine():
    files = _files()
    assert len(files) > 100  # the scan reaches the suite
    found = {
        str(path.relative_to(ROOT)): [line for line, _ in pinned_digests(path.read_text("utf-8"))]
        for path in files
    }
    offenders = {name: lines for name, lines in found.items() if lines}
    assert offenders == {}, (
        "compute both sides on the machine that runs the test, or mark a digest of a fixture "
        f"the test writes itself with '{MARKER}'"
    )
