"""SecMax (tournament tree) and SecSrt (Batcher's bitonic network) over entries with payloads.

An entry is a tuple of fields (``SharedTensor``s with a common leading axis of length T); the
key fields and any payload (e.g. a shared round index) travel together. A comparator maps two
aligned batches of entries (a, b) to shares of [a ranks at least as high as b]; the default,
``compare_first``, is SecGE on the first field. Every compare-exchange runs one comparator call
for a whole layer, then one round of SecSel for all fields: hi = SecSel(bit, a, b),
lo = a + b - hi (local).

SecMax: ceil(log2 T) layers, T - 1 comparisons. SecSrt: sorts in descending order by default;
T is padded to a power of two N with public sentinel entries that always lose, and the network
has log2(N) (log2(N) + 1) / 2 layers of N / 2 comparators. Sorting is not stable: the payloads
of equal keys may come out in either order.

Paper: Liu et al., Starfish, Table VI (SecMax, SecSrt); Starfish spec §3.4 (SecMax, SecSrt).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fedunlearn.mpc.protocols.beaver import sec_constant, sec_mul_many
from fedunlearn.mpc.protocols.compare import sec_ge
from fedunlearn.mpc.shares import SharedTensor, concatenate

__all__ = ["Comparator", "compare_first", "sec_max", "sec_sort"]

Entries = tuple[SharedTensor, ...]
Comparator = Callable[[Entries, Entries], SharedTensor]
_SENTINEL_RING = 1 << 61  # |sentinel key| in ring units: far beyond data, still |d| < 2^63


def compare_first(a: Entries, b: Entries) -> SharedTensor:
    """Default comparator: SecGE on the first field, [a[0] >= b[0]]."""
    return sec_ge(a[0], b[0])


def _exchange(bit: SharedTensor, a: Entries, b: Entries) -> tuple[Entries, Entries]:
    """Compare-exchange: (winners, losers) per field, one round of SecSel for all fields."""
    bits = [bit.reshape(*bit.shape, *([1] * (f.ndim - bit.ndim))) for f in a]
    diffs = [fa - fb for fa, fb in zip(a, b, strict=True)]
    products = sec_mul_many(bits, diffs)
    hi = tuple(fb + p for fb, p in zip(b, products, strict=True))
    lo = tuple(fa + fb - h for fa, fb, h in zip(a, b, hi, strict=True))
    return hi, lo


def sec_max(entries: Sequence[SharedTensor], comparator: Comparator = compare_first) -> Entries:
    """SecMax: the highest-ranked entry along axis 0, by a tournament tree.

    Args:
        entries: Fields with a common leading axis T >= 1 (other axes are independent batches,
            e.g. one column per client).
        comparator: Ranks two batches of entries; default SecGE on the first field.

    Returns:
        The winning entry's fields (leading axis removed).
    """
    fields = tuple(entries)
    if len(fields[0]) == 0:
        raise ValueError("sec_max needs at least one entry")
    while len(fields[0]) > 1:
        count = len(fields[0])
        half = count // 2
        a = tuple(f[0 : 2 * half : 2] for f in fields)
        b = tuple(f[1 : 2 * half : 2] for f in fields)
        winners, _ = _exchange(comparator(a, b), a, b)
        if count % 2:
            winners = tuple(
                concatenate([w, f[count - 1 :]]) for w, f in zip(winners, fields, strict=True)
            )
        fields = winners
    return tuple(f[0] for f in fields)


def _constant(like: SharedTensor, ring_value: int, count: int) -> SharedTensor:
    """Sentinel entries: a public ring value, re-randomised (``sec_constant``), never (c, 0)."""
    values = np.full((count, *like.shape[1:]), ring_value, dtype=np.int64)
    raw = sec_constant(like.party, values, frac_bits=0)  # integers at scale 0: raw ring units
    return SharedTensor(raw.share, like.party, like.frac_bits)


def _stages(size: int, descending: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """Layers of the bitonic network as (first, second) index arrays; first takes the winner."""
    idx = np.arange(size)
    layers, k = [], 2
    while k <= size:
        j = k // 2
        while j >= 1:
            partner = idx ^ j
            low, high = idx[partner > idx], partner[partner > idx]
            winner_low = ((low & k) == 0) == descending
            layers.append((np.where(winner_low, low, high), np.where(winner_low, high, low)))
            j //= 2
        k *= 2
    return layers


def sec_sort(
    entries: Sequence[SharedTensor],
    comparator: Comparator = compare_first,
    descending: bool = True,
    padding: Sequence[int] | None = None,
) -> Entries:
    """SecSrt: sort entries along axis 0 with a bitonic network, carrying all fields.

    Args:
        entries: Fields with a common leading axis T.
        comparator: Ranks two batches of entries; default SecGE on the first field.
        descending: Highest-ranked first (default, as Starfish's round selection needs).
        padding: Ring values (raw uint64 units, may be negative) of the sentinel entry's fields;
            it must rank below every real entry (above, if ascending). Default: first field
            -2^61 (or +2^61 ascending), other fields 0; right for ``compare_first``.

    Returns:
        The sorted fields, length T (sentinels removed).
    """
    fields = tuple(entries)
    count = len(fields[0])
    size = 1 << max(count - 1, 0).bit_length()
    if size > count:
        if padding is None:
            padding = [-_SENTINEL_RING if descending else _SENTINEL_RING] + [0] * (len(fields) - 1)
        fields = tuple(
            concatenate([f, _constant(f, int(p), size - count)])
            for f, p in zip(fields, padding, strict=True)
        )
    for first, second in _stages(size, descending):
        a = tuple(f[first] for f in fields)
        b = tuple(f[second] for f in fields)
        winners, losers = _exchange(comparator(a, b), a, b)
        updated = []
        for f, w, lo in zip(fields, winners, losers, strict=True):
            share = f.share.copy()
            share[first], share[second] = w.share, lo.share
            updated.append(SharedTensor(share, f.party, w.frac_bits))
        fields = tuple(updated)
    return tuple(f[:count] for f in fields)
