"""AES-CTR seed expansion and the dealer's correlated randomness (MPC2 in docs/mpc.md)."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedunlearn.mpc import Dealer, FixedPoint, expand_seed
from fedunlearn.mpc.dealer import KINDS
from fedunlearn.mpc.prg import Prg

SEED = bytes(range(16))


def both(seed: int = 3) -> tuple[Dealer, Dealer]:
    return Dealer(seed, 0), Dealer(seed, 1)


def test_expansion_is_aes_ctr_key_stream():
    # Prepare: the reference key stream straight from the cipher
    reference = Cipher(algorithms.AES(SEED), modes.CTR(bytes(16))).encryptor().update(bytes(80))
    # Execute
    words = expand_seed(SEED, 10)
    # Assert
    assert words.dtype == np.uint64
    assert words.tobytes() == reference


def test_stream_continues_across_calls_and_seeds_differ():
    prg = Prg(SEED)
    np.testing.assert_array_equal(
        np.concatenate([prg.words(3), prg.words(5)]), expand_seed(SEED, 8)
    )
    assert not np.array_equal(expand_seed(SEED, 8), expand_seed(bytes(16), 8))
    with pytest.raises(ValueError, match="16 bytes"):
        Prg(b"short")


def test_expanded_words_look_uniform():
    words = expand_seed(SEED, 100_000)
    bits = np.unpackbits(words.view(np.uint8))
    assert abs(bits.mean() - 0.5) < 0.005
    assert len(np.unique(words)) == words.size


def test_elementwise_triple_reconstructs():
    d0, d1 = both()
    (a0, b0, c0), (a1, b1, c1) = d0.triple((5, 3)), d1.triple((5, 3))
    np.testing.assert_array_equal(c0 + c1, (a0 + a1) * (b0 + b1))
    assert a0.shape == (5, 3)


def test_matrix_and_inner_triples_reconstruct():
    d0, d1 = both()
    (a0, b0, c0), (a1, b1, c1) = d0.matrix_triple((2, 3), (3, 4)), d1.matrix_triple((2, 3), (3, 4))
    np.testing.assert_array_equal(c0 + c1, (a0 + a1) @ (b0 + b1))
    (a0, b0, c0), (a1, b1, c1) = d0.inner_triple((4, 6)), d1.inner_triple((4, 6))
    np.testing.assert_array_equal(c0 + c1, np.sum((a0 + a1) * (b0 + b1), axis=-1))


def test_square_pair_and_boolean_triple_reconstruct():
    d0, d1 = both()
    (a0, c0), (a1, c1) = d0.square_pair((7,)), d1.square_pair((7,))
    np.testing.assert_array_equal(c0 + c1, (a0 + a1) * (a0 + a1))
    (a0, b0, c0), (a1, b1, c1) = d0.and_triple((9,)), d1.and_triple((9,))
    np.testing.assert_array_equal(c0 ^ c1, (a0 ^ a1) & (b0 ^ b1))


def test_boolean_triples_with_a_shared_left_mask_reconstruct():
    d0, d1 = both()
    (a0, b10, c10, b20, c20), (a1, b11, c11, b21, c21) = (
        d0.and_triple_shared((9,)),
        d1.and_triple_shared((9,)),
    )
    a = a0 ^ a1
    np.testing.assert_array_equal(c10 ^ c11, a & (b10 ^ b11))
    np.testing.assert_array_equal(c20 ^ c21, a & (b20 ^ b21))
    assert d1.counters.offline.bytes_received == 16 + 2 * 9 * 8


def test_random_bits_agree_in_both_sharings():
    d0, d1 = both()
    (b0, r0), (b1, r1) = d0.random_bits((2000,)), d1.random_bits((2000,))
    bits = b0 ^ b1
    assert set(np.unique(bits)) == {0, 1}
    np.testing.assert_array_equal(r0 + r1, bits)
    assert 0.45 < bits.mean() < 0.55


def test_zero_shares_cancel_and_random_shares_differ():
    d0, d1 = both()
    np.testing.assert_array_equal(d0.zero((6,)) + d1.zero((6,)), np.zeros(6, np.uint64))
    assert not np.array_equal(d0.random((6,)), d1.random((6,)))


def test_invertible_masks_are_well_conditioned_fixed_point_matrices():
    fp = FixedPoint()
    d0, d1 = both()
    r = fp.decode(d0.invertible_mask((3, 4, 4), fp) + d1.invertible_mask((3, 4, 4), fp))
    assert np.all(np.linalg.cond(r) <= 400)
    assert np.max(np.abs(r)) <= d0.mask_bound()


def test_offline_bytes_are_seeds_plus_one_correction_for_party_1():
    d0, d1 = both()
    d0.triple((100,))
    d1.triple((100,))
    assert d0.counters.offline.bytes_received == 16
    assert d1.counters.offline.bytes_received == 16 + 100 * 8
    assert d0.counters.offline.messages == d1.counters.offline.messages == 1
    assert d0.counters.online.bytes_received == 0


def test_requests_must_come_in_the_same_order():
    d0, d1 = both()
    d1.zero((4,))  # party 1 is one request ahead: its triple is request 1, party 0's is 0
    (a0, b0, c0), (a1, b1, c1) = d0.triple((4,)), d1.triple((4,))
    assert not np.array_equal(c0 + c1, (a0 + a1) * (b0 + b1))


@pytest.mark.parametrize("kind", KINDS)
def test_each_party_gets_its_own_seed_except_for_zerogen(kind):
    from fedunlearn.mpc.dealer import Request, master_seed, request_seeds

    shapes = ((2, 3), (3, 3)) if kind == "matrix" else ((2, 3, 3),)
    request = Request(kind, shapes, 13 if kind == "mask" else 0)
    s0, s1, private = request_seeds(master_seed(3), 0, request)
    assert len({s0, s1, private}) == (2 if kind == "zero" else 3)
    assert private not in (s0, s1)  # a mask's randomness comes from a seed no party receives


def test_malformed_requests_are_refused_before_any_work():
    from fedunlearn.mpc.dealer import Request

    with pytest.raises(ValueError, match="unknown dealer request kind"):
        Request("tripel", ((3,),))
    with pytest.raises(ValueError, match="cannot be multiplied"):
        Request("matrix", ((2, 3), (4, 5)))
    with pytest.raises(ValueError, match="square matrices"):
        Request("mask", ((2, 3),), 13)
