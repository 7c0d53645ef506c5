import numpy as np
import pytest

from jaxloops import pallas_kernels as pk
from jaxloops.attention import causal_mask


def blocks(Tb, Sb, is_causal=True, causal_offset=0):
    return pk.Blocks(Tb, Sb, is_causal, interpret=True, causal_offset=causal_offset)


def stitched(T, S, b, keys_first=False):
    """The kernel's per-block masks (`causal_keep`, every block computed), put side by side."""
    rows = []
    for i in range(T // b.block_q):
        row = []
        for j in range(S // b.block_k):
            shape = (b.block_k, b.block_q) if keys_first else (b.block_q, b.block_k)
            keep = np.asarray(pk.causal_keep(i, j, shape, b, keys_first=keys_first))
            row.append(keep.T if keys_first else keep)
        rows.append(np.concatenate(row, axis=1))
    return np.concatenate(rows, axis=0)


@pytest.mark.parametrize("T, S, Tb, Sb", [(24, 24, 8, 8), (24, 40, 8, 4), (32, 16, 4, 8)])
def test_the_block_masks_make_the_causal_mask_and_skip_only_what_it_hides(T, S, Tb, Sb):
    b = blocks(Tb, Sb)
    expected = np.asarray(causal_mask(T, S))
    np.testing.assert_array_equal(stitched(T, S, b), expected)
    np.testing.assert_array_equal(stitched(T, S, b, keys_first=True), expected)
    for i in range(T // Tb):
        for j in range(S // Sb):
            part = expected[i * Tb : (i + 1) * Tb, j * Sb : (j + 1) * Sb]
            assert bool(pk.is_visible(i, j, b)) == part.any(), (i, j)
            assert bool(pk.needs_mask(i, j, b)) == (part.any() and not part.all()), (i, j)
            assert (int(pk.first_query_block(j, b)) <= i) == bool(pk.is_visible(i, j, b))
    # One key block off: the mask of `causal_mask(offset=Sb)`, which the tests' wrong kernel runs.
    off = blocks(Tb, Sb, causal_offset=1)
    np.testing.assert_array_equal(stitched(T, S, off), np.asarray(causal_mask(T, S, offset=Sb)))


def test_causal_computes_and_fetches_the_triangle():
    n = 8
    full = pk.block_counts(n * 128, n * 128, blocks(128, 128, is_causal=False))
    causal = pk.block_counts(n * 128, n * 128, blocks(128, 128))
    assert full == {"steps": n * n, "computed": n * n, "masked": 0, "fetched": n * n}
    # The triangle's n (n + 1) / 2 blocks, n of them on the diagonal, masked: full / causal is
    # 2 n / (n + 1). Query block 1's first key block is the one query block 0 ended on: one
    # fetch fewer than the blocks computed.
    assert causal == {"steps": n * n, "computed": n * (n + 1) // 2, "masked": n,
                      "fetched": n * (n + 1) // 2 - 1}  # fmt: skip
    # Query blocks of two key blocks: each crosses the diagonal in its last two.
    wide = pk.block_counts(4 * 256, 8 * 128, blocks(256, 128))
    assert wide["computed"] == 2 + 4 + 6 + 8 and wide["masked"] == 4 * 2


def test_skipped_steps_hold_the_block_they_have():
    b = blocks(128, 128)
    held = [[int(pk.key_block_to_fetch(i, j, b)) for j in range(4)] for i in range(4)]
    assert held == [[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 2, 2], [0, 1, 2, 3]]
    held = [[int(pk.query_block_to_fetch(i, j, b, 4)) for i in range(4)] for j in range(4)]
    assert held == [[0, 1, 2, 3], [1, 1, 2, 3], [2, 2, 2, 3], [3, 3, 3, 3]]
    # Full attention: every step its own block.
    assert int(pk.key_block_to_fetch(2, 3, blocks(128, 128, is_causal=False))) == 3
