"""Secure comparison: SecGE (A2B of the sign by an MSB-only carry tree, then B2A) and SecGE2/3/4.

SecGE(x, y) returns shares of the bit [x >= y] at integer scale. With d = x - y (local), x >= y
iff MSB(d) = 0, provided |d| < 2^63 (guaranteed for encodable values, |x| < 2^(62 - f)).
The two shares d_0, d_1 are the inputs of a boolean adder: d_0 is XOR-shared as (d_0, 0) and
d_1 as (0, d_1). MSB(d) = bit63(d_0) XOR bit63(d_1) XOR c_63, and only the carry c_63 into bit
63 is computed: it is the group generate of bits 0..62 (bit 63 is made a pure propagate bit,
g = 0 and p = 1, so the 64-bit block's generate equals it). A binary tree of (G, P) blocks gives
it in 6 levels, bit-packed so that the opened words shrink with the live bits:

1. level 0: g = d_0 AND d_1 with a boolean triple, one word per value (2 words opened);
2. levels 1..5 (blocks of 2^L bits): G = G_hi XOR (P_hi AND G_lo), P = P_hi AND P_lo. Only
   64 / 2^L bits per value are live, so 2^L values share one word and each level opens 3 words
   per 2^L values (one ``and_triple_shared``: P_hi XOR a is opened once for both ANDs);
3. level 6: the last block's G only (2 words per 64 values);
4. NOT flips party 0's bit; B2A opens c = b XOR r for a dealer bit r shared both ways and sets
   [b] = c + [r] - 2c[r] (MPC3 in docs/mpc.md).

Cost per comparison and party, for n comparisons in one call: 8 rounds and
16 n + 24 (ceil(n/2) + ... + ceil(n/32)) + 16 ceil(n/64) bytes + ceil(n/8) bytes of packed bits
sent, i.e. 39.5 bytes + 1 bit per comparison for large n and 152 bytes + 1 bit for n = 1;
offline 7 AND-triple requests and one random-bit request (party 1 receives the corrections).
``ge_cost`` gives the exact counts. (A word-level Kogge-Stone adder, which keeps all 64 prefix
carries, opens 152 bytes per comparison at every n; the tree is never more expensive.)

Ideal mode (MPC3): the parties hand their shares of d to the trusted functionality over an
uncounted channel, the functionality returns fresh shares of the bit (a dealer ZeroGen pair), and
the real protocol's online and offline bytes, rounds and messages are charged instead. It opens
nothing to protocol code but is NOT secure (each party's process sees d); use it for cost sweeps
only.

Paper: Liu et al., Starfish, Tables IV-V, App. B-B item 5 (SecGE), Sec. IV-A2 (SecGE2), Alg. 5
and App. C (SecGE3, SecGE4). The tree is the standard carry-lookahead (Brent-Kung) reduction
restricted to the carry-out.
Deviations: [FIX] SecGE3 uses [z] (not [z_i]) in step 2 and SecGE4 reads (2 w_i - 1) (MPC4 in
docs/mpc.md). [FIX] ties: for two negative-sign entries the paper returns 1 - [b_i >= b_j], which
is 0 on equal values; we use [b_j >= b_i] there, so equal entries compare as >= in every case
(MPC4). [REC] SecGE computes only the carry into bit 63 (above), not the paper's full A2B adder
(MPC3).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from fedunlearn.mpc.party import Party
from fedunlearn.mpc.prg import SEED_BYTES
from fedunlearn.mpc.protocols.beaver import sec_mul, sec_mul_many
from fedunlearn.mpc.shares import SharedTensor, stack

__all__ = ["ge_cost", "sec_ge", "sec_ge2", "sec_ge3", "sec_ge4"]

U64 = NDArray[np.uint64]
_ONE = np.uint64(1)
_LOW63 = np.uint64((1 << 63) - 1)
_TOP = np.uint64(1 << 63)
_LEVELS = 6  # tree levels after the generate bits; the last updates G only
# level L -> L + 1: bits at positions p with (p mod 2^(L+1)) < 2^L (0x5555..., 0x3333..., ...)
_HALF = [
    np.uint64(sum(1 << p for p in range(64) if p % (2 << level) < (1 << level)))
    for level in range(_LEVELS)
]
_SHIFTS = np.arange(64, dtype=np.uint64)


def _and(party: Party, x: U64, y: U64) -> U64:
    """XOR-shared AND of two word vectors with a boolean Beaver triple (one round)."""
    a, b, c = party.dealer.and_triple(x.shape)
    mine = np.concatenate([x ^ a, y ^ b])
    opened = mine ^ party.transport.exchange(mine)
    e, f = opened[: x.size], opened[x.size :]
    z = c ^ (e & b) ^ (f & a)
    if party.party_id == 0:
        z ^= e & f
    return z


def _and_pair(party: Party, x: U64, y1: U64, y2: U64) -> tuple[U64, U64]:
    """Return (x AND y1, x AND y2) in one round, opening x XOR a once (3 words per element)."""
    a, b1, c1, b2, c2 = party.dealer.and_triple_shared(x.shape)
    n = x.size
    mine = np.concatenate([x ^ a, y1 ^ b1, y2 ^ b2])
    opened = mine ^ party.transport.exchange(mine)
    e, f1, f2 = opened[:n], opened[n : 2 * n], opened[2 * n :]
    z1 = c1 ^ (e & b1) ^ (f1 & a)
    z2 = c2 ^ (e & b2) ^ (f2 & a)
    if party.party_id == 0:
        z1 ^= e & f1
        z2 ^= e & f2
    return z1, z2


def _pair_words(words: U64, width: np.uint64) -> U64:
    """Merge word pairs: even words keep their live bits, odd ones move up by ``width``."""
    if words.size % 2:  # a zero word pads dead value slots (public zeros, shares (0, 0))
        words = np.append(words, np.uint64(0))
    return words[0::2] | (words[1::2] << width)


def _word_counts(count: int) -> list[int]:
    """Words opened per AND operand at level 0 and at each tree level for ``count`` values."""
    return [count] + [-(-count // (2 << level)) for level in range(_LEVELS)]


def _carry_63(party: Party, d: U64) -> U64:
    """XOR shares (0/1 per value) of the carry into bit 63 of d_0 + d_1 (7 rounds).

    Layout after level L (blocks of 2^L bits): one word holds 2^L values; block j of value s
    sits at bit j 2^L + s. Going to level L + 1, each word's hi/lo blocks are aligned with a
    mask and shift, and word pairs merge, so level L touches n / 2^L words (O(2n) in all).
    """
    low = d & _LOW63
    zero = np.zeros_like(low)
    x, y = (low, zero) if party.party_id == 0 else (zero, low)
    g = _and(party, x, y)  # level 0: generate bits
    p = low | _TOP if party.party_id == 0 else low  # propagate: XOR shares are own shares;
    # bit 63 propagates (g = 0, p = 1), so the 64-bit block's G is the carry into bit 63
    for level in range(_LEVELS):
        width, mask = np.uint64(1 << level), _HALF[level]
        g_hi = _pair_words((g >> width) & mask, width)
        g_lo = _pair_words(g & mask, width)
        p_hi = _pair_words((p >> width) & mask, width)
        if level < _LEVELS - 1:
            carried, p = _and_pair(party, p_hi, g_lo, _pair_words(p & mask, width))
        else:  # the last block: G only
            carried = _and(party, p_hi, g_lo)
        g = g_hi ^ carried
    bits = ((g[:, None] >> _SHIFTS) & _ONE).reshape(-1)  # bit s of word w: value 64 w + s
    return bits[: d.size]


def _msb(party: Party, d: U64) -> U64:
    """A2B of the MSB: XOR shares (words 0/1) of bit 63 of d_0 + d_1 (7 rounds)."""
    return ((d >> np.uint64(63)) ^ _carry_63(party, d)) & _ONE


def _b2a(party: Party, bits: U64) -> U64:
    """B2A of XOR-shared bits with a dealer bit r in both sharings (one round, 1 bit each)."""
    rb, ra = party.dealer.random_bits(bits.shape)
    mine = np.packbits((bits ^ rb).astype(np.uint8))
    c = np.unpackbits(mine ^ party.transport.exchange(mine), count=bits.size).astype(np.uint64)
    # B2A with a dealer bit r shared both ways (MPC3): [b]_A = c + [r]_A - 2 c [r]_A
    z = ra - ((c * ra) << _ONE)
    if party.party_id == 0:
        z += c
    return z


def ge_cost(count: int, party_id: int) -> dict[str, dict[str, int]]:
    """Exact traffic of the real SecGE on ``count`` comparisons (one call) for one party.

    Returns:
        ``{"online": {...}, "offline": {...}}`` with bytes_sent, bytes_received, rounds and
        messages, in the layout of ``Counters.snapshot()``.
    """
    level0, *levels = _word_counts(count)
    # words opened: 2 at level 0, 3 per middle level (and_triple_shared), 2 at the last level
    online_bytes = 8 * (2 * level0 + 3 * sum(levels[:-1]) + 2 * levels[-1]) + math.ceil(count / 8)
    requests = _LEVELS + 2  # AND triples for g and each level; one random-bit request
    # party 1's corrections: c per AND triple, (c1, c2) per shared pair, [r]_A per random bit
    words = level0 + 2 * sum(levels[:-1]) + levels[-1] + count
    corrections = 8 * words if party_id == 1 else 0
    return {
        "online": {
            "bytes_sent": online_bytes,
            "bytes_received": online_bytes,
            "rounds": _LEVELS + 2,
            "messages": _LEVELS + 2,
        },
        "offline": {
            "bytes_sent": 0,
            "bytes_received": requests * SEED_BYTES + corrections,
            "rounds": 0,
            "messages": requests,
        },
    }


def _ge_ideal(party: Party, d: U64) -> U64:
    """Ideal F_GE: fresh shares of [d >= 0], charging the real protocol's traffic."""
    plain = d + party.transport.exchange_uncounted(d)  # the functionality's view, not the party's
    bit = (plain >> np.uint64(63)) ^ _ONE
    mask = party.dealer.zero(d.shape, charged=False)
    cost = ge_cost(d.size, party.party_id)
    for phase, traffic in cost.items():
        party.counters.charge(
            sent=traffic["bytes_sent"],
            received=traffic["bytes_received"],
            rounds=traffic["rounds"],
            messages=traffic["messages"],
            phase=phase,
        )
    return mask + bit if party.party_id == 1 else mask


def sec_ge(
    x: SharedTensor, y: SharedTensor | float | np.integer | np.ndarray, mode: str | None = None
) -> SharedTensor:
    """SecGE: shares of [x >= y] (0/1 at integer scale), elementwise with broadcasting.

    Args:
        x: Left operand.
        y: Right operand, secret or public; scales are aligned exactly before subtracting.
        mode: ``"real"`` (GMW circuit) or ``"ideal"``; default: the party's ``comparison``.

    Returns:
        A ``SharedTensor`` of bits with ``frac_bits == 0``, usable in ``sec_select``.
    """
    party = x.party
    d = (x - y).share
    mode = party.comparison if mode is None else mode
    if mode not in ("real", "ideal"):
        raise ValueError(f"mode must be 'real' or 'ideal'; got {mode!r}")
    flat = np.ascontiguousarray(d).reshape(-1)
    if flat.size == 0:
        return SharedTensor(np.zeros(d.shape, np.uint64), party, 0)
    if mode == "ideal":
        bits = _ge_ideal(party, flat)
    else:
        msb = _msb(party, flat)
        if party.party_id == 0:
            msb ^= _ONE  # [x >= y] = NOT MSB(d)
        bits = _b2a(party, msb)
    return SharedTensor(bits.reshape(d.shape), party, 0)


def sec_ge2(
    u_i: SharedTensor, v_i: SharedTensor, u_j: SharedTensor, v_j: SharedTensor
) -> SharedTensor:
    """SecGE2: [u_i / v_i >= u_j / v_j] for v > 0, as [u_i v_j >= u_j v_i] (no division).

    The two products run in one round and are compared untruncated (scale 2f), so the result
    is exact; keep |u v| < 2^(62 - 2f).
    """
    w_i, w_j = sec_mul_many([u_i, u_j], [v_j, v_i], truncate=False)
    return sec_ge(w_i, w_j)


def _signed_ge(
    w_i: SharedTensor, m_i: SharedTensor, w_j: SharedTensor, m_j: SharedTensor
) -> SharedTensor:
    """[s_i sqrt(m_i) >= s_j sqrt(m_j)], s = +1 where the sign bit w = 1 (Alg. 5, tie-fixed)."""
    both = sec_ge(stack([w_i, w_j, m_i, m_j]), stack([w_j, w_i, m_j, m_i]))
    x, x_rev, z, z_rev = both[0], both[1], both[2], both[3]
    # equal signs: w_i z + (1 - w_i) z_rev; unequal: x decides (Alg. 5 step 3)
    t, xx = sec_mul_many([w_i, x], [z - z_rev, x_rev])
    return x + sec_mul(xx, z_rev + t - 1)


def sec_ge3(
    w_i: SharedTensor, b_i: SharedTensor, w_j: SharedTensor, b_j: SharedTensor
) -> SharedTensor:
    """SecGE3 (Alg. 5): compare signed cosines s_i sqrt(b_i) >= s_j sqrt(b_j).

    Args:
        w_i: Sign bits (1 iff the cosine numerator is >= 0), integer scale.
        b_i: Squared cosines.
        w_j: Sign bits of the other side.
        b_j: Squared cosines of the other side.
    """
    return _signed_ge(w_i, b_i, w_j, b_j)


def sec_ge4(
    w_i: SharedTensor,
    a_i: SharedTensor,
    v_i: SharedTensor,
    w_j: SharedTensor,
    a_j: SharedTensor,
    v_j: SharedTensor,
) -> SharedTensor:
    """SecGE4 (App. C): SecGE3 with b = a / v compared by cross-multiplication (a = u^2)."""
    p_i, p_j = sec_mul_many([a_i, a_j], [v_j, v_i], truncate=False)
    return _signed_ge(w_i, p_i, w_j, p_j)
