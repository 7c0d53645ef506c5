"""What one grid step of the Pallas attention kernels computes (`jaxloops.pallas_attention`
builds the grids, the BlockSpecs and the calls around them).

A step holds tiles in VMEM: Tb queries and Sb keys of one head, (Tb, H) and (Sb, H), laid
out in a TPU's vector registers of 8 sublanes by 128 lanes. The forward step folds one key
block into the online softmax's carry, which lives in VMEM scratch for the whole walk over
the key blocks. Causal, which blocks a step computes, masks or skips, and which block the
pipeline fetches for it, are small integer functions of the grid indices (i, j), the same
ones the index maps call; `block_counts` evaluates them over a whole grid.
"""

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from jaxloops.attention import masked_fill_value

LANES = 128  # a TPU vector register is (8, 128): 8 sublanes by 128 lanes
SUBLANES = 8
MASKED = masked_fill_value(jnp.float32)


def broadcast_lanes(x, width: int):
    """(rows, 128) with one value per row, repeated across the lanes, as (rows, width).

    The carry keeps a row's max and sum in all 128 lanes of its row, the layout that
    broadcasts against a score or output tile without moving data between lanes.
    """
    if width <= LANES:
        return x[:, :width]
    return jnp.tile(x, (1, width // LANES))  # width is a multiple of 128 (`make_blocks`)


def mxu_dot(a, b, *, contract_last: bool = False):
    """a @ b (or a @ b.T with `contract_last`) on the MXU, accumulated in float32.

    bfloat16 operands go through the MXU in one pass; float32 operands at float32 precision
    (`Precision.HIGHEST`): at the default precision a TPU rounds them to bfloat16 first.
    """
    precision = lax.Precision.HIGHEST if a.dtype == jnp.float32 else lax.Precision.DEFAULT
    dims = (((1,), (1,)), ((), ())) if contract_last else (((1,), (0,)), ((), ()))
    return lax.dot_general(
        a, b, dims, precision=(precision, precision), preferred_element_type=jnp.float32
    )


def online_softmax_update(m_ref, l_ref, acc_ref, scores, values):
    """Folds one key block into the carry in VMEM: `online_softmax_step`, kernel-side.

    Args:
      m_ref, l_ref: running max and sum, (Tb, 128) float32, one value per row.
      acc_ref: running unnormalised output, (Tb, H) float32.
      scores: this block's scaled, masked logits, (Tb, Sb) float32.
      values: this block's values, (Sb, H).
    """
    m_old = m_ref[...]  # (Tb, 128)
    m_new = jnp.maximum(m_old, scores.max(axis=-1, keepdims=True))  # (Tb, 128)
    # Everything summed so far was relative to the old max: rescale it to the new one.
    correction = jnp.exp(m_old - m_new)  # (Tb, 128)
    weights = jnp.exp(scores - broadcast_lanes(m_new, scores.shape[1]))  # (Tb, Sb)
    l_ref[...] = l_ref[...] * correction + weights.sum(axis=-1, keepdims=True)
    mixed = mxu_dot(weights.astype(values.dtype), values)  # (Tb, H)
    acc_ref[...] = acc_ref[...] * broadcast_lanes(correction, acc_ref.shape[1]) + mixed
    m_ref[...] = m_new


class Blocks(NamedTuple):
    """What the kernels are built from (static under jit).

    `update` and `causal_offset` exist for the tests: they feed known-wrong kernels (a step
    that drops the rescale, a diagonal one block off) to the same bound as the right one.
    """

    block_q: int  # Tb, queries per block
    block_k: int  # Sb, keys per block
    is_causal: bool
    interpret: Any  # False: compiled for the TPU; True or InterpretParams: interpreted
    vmem_limit_bytes: int | None = None  # None: Mosaic's default scoped limit
    update: Callable = online_softmax_update  # the forward's step
    causal_offset: int = 0  # key blocks past its own position a query sees (0: causal)


def last_key_block(i, blocks: Blocks):
    """The last key block query block i sees (causal; may exceed the last block there is)."""
    return (i * blocks.block_q + blocks.block_q - 1) // blocks.block_k + blocks.causal_offset


def first_query_block(j, blocks: Blocks):
    """The first query block that sees key block j (causal)."""
    return jnp.maximum((j - blocks.causal_offset) * blocks.block_k // blocks.block_q, 0)


def is_visible(i, j, blocks: Blocks):
    """Whether query block i sees any key of key block j."""
    return True if not blocks.is_causal else j <= last_key_block(i, blocks)


def needs_mask(i, j, blocks: Blocks):
    """Whether query block i sees key block j only in part: a block that crosses the diagonal."""
    if not blocks.is_causal:
        return False
    # The block's last key lies past the last key its first query sees.
    first_query_sees = i * blocks.block_q + blocks.causal_offset * blocks.block_k
    return is_visible(i, j, blocks) & ((j + 1) * blocks.block_k - 1 > first_query_sees)


def key_block_to_fetch(i, j, blocks: Blocks):
    """The key/value block the pipeline holds at step (i, j): j, or causal, the last block
    query block i sees, repeated past it, so that the skipped steps fetch nothing."""
    return jnp.minimum(j, last_key_block(i, blocks)) if blocks.is_causal else j


def query_block_to_fetch(i, j, blocks: Blocks, n_query_blocks: int):
    """The query block the dK/dV pipeline holds at (i, j): i, or causal, the first query
    block that sees key block j while i is before it (nothing new is fetched)."""
    if not blocks.is_causal:
        return i
    return jnp.minimum(jnp.maximum(i, first_query_block(j, blocks)), n_query_blocks - 1)


def on_visible_blocks(i, j, blocks: Blocks, step: Callable[[bool], None]) -> None:
    """Runs step(masked) for block (i, j): masked=False below the diagonal, True on it, and
    not at all above it."""
    if not blocks.is_causal:
        step(False)
        return
    pl.when(is_visible(i, j, blocks) & ~needs_mask(i, j, blocks))(lambda: step(False))
    pl.when(needs_mask(i, j, blocks))(lambda: step(True))


def causal_keep(i, j, shape, blocks: Blocks, keys_first: bool = False):
    """(Tb, Sb) booleans, True where query t sees key s (s <= t + causal_offset * Sb);
    (Sb, Tb) with `keys_first` (the dK/dV kernel's transposed scores)."""
    rows, cols = (lax.broadcasted_iota(jnp.int32, shape, d) for d in (0, 1))
    queries, keys = (cols, rows) if keys_first else (rows, cols)
    query_pos, key_pos = i * blocks.block_q + queries, j * blocks.block_k + keys
    return key_pos <= query_pos + blocks.causal_offset * blocks.block_k


def scaled_query(q_ref):
    """The query tile times 1/sqrt(H), rounded to its dtype as `jaxloops.attention` rounds it."""
    q = q_ref[...]
    return q * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype)


def forward_kernel(q_ref, k_ref, v_ref, o_ref, lse_ref, m_ref, l_ref, acc_ref, *, blocks):
    """One grid step (b, n, i, j): fold key block j into query block i's carry."""
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _start():  # a new query block: an empty carry
        m_ref[...] = jnp.full(m_ref.shape, MASKED, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def step(masked: bool):
        scores = mxu_dot(scaled_query(q_ref), k_ref[...], contract_last=True)  # (Tb, Sb)
        if masked:
            scores = jnp.where(causal_keep(i, j, scores.shape, blocks), scores, MASKED)
        blocks.update(m_ref, l_ref, acc_ref, scores, v_ref[...])

    on_visible_blocks(i, j, blocks, step)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():  # the last key block: normalise; keep the log-sum-exp for a backward pass
        l = l_ref[...]
        o_ref[...] = (acc_ref[...] / broadcast_lanes(l, acc_ref.shape[1])).astype(o_ref.dtype)
        if lse_ref is not None:
            lse_ref[...] = m_ref[...] + jnp.log(l)


def dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref, acc_ref, *, blocks):
    """One step (b, n, i, j) of dQ: the weights of block (i, j) rebuilt from the log-sum-exp."""
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _start():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def step(masked: bool):
        k = k_ref[...]
        scores = mxu_dot(scaled_query(q_ref), k, contract_last=True)  # (Tb, Sb)
        if masked:
            scores = jnp.where(causal_keep(i, j, scores.shape, blocks), scores, MASKED)
        weights = jnp.exp(scores - lse_ref[0][:, None])  # P = exp(S - lse), (Tb, Sb)
        d_weights = mxu_dot(do_ref[...], v_ref[...], contract_last=True)  # dP = dO V^T
        d_scores = weights * (d_weights - delta_ref[0][:, None])  # dS = P (dP - D)
        acc_ref[...] += mxu_dot(d_scores.astype(k.dtype), k)  # dS K, (Tb, H)

    on_visible_blocks(i, j, blocks, step)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():  # the scores are (Q / sqrt(H)) K^T
        scale = jnp.asarray(1.0 / math.sqrt(dq_ref.shape[-1]), dq_ref.dtype)
        dq_ref[...] = (acc_ref[...] * scale.astype(jnp.float32)).astype(dq_ref.dtype)


def dkv_kernel(
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref, dk_acc, dv_acc, *,
    blocks, n_query_blocks,
):  # fmt: skip
    """One step (b, h, j, r) of dK and dV: key block j against query block r % nQ of query
    head h * G + r // nQ, the scores transposed (keys in rows)."""
    j, r = pl.program_id(2), pl.program_id(3)
    i = r % n_query_blocks

    @pl.when(r == 0)
    def _start():
        dk_acc[...] = jnp.zeros(dk_acc.shape, jnp.float32)
        dv_acc[...] = jnp.zeros(dv_acc.shape, jnp.float32)

    def step(masked: bool):
        q, do = scaled_query(q_ref), do_ref[...]
        scores = mxu_dot(k_ref[...], q, contract_last=True)  # S^T, (Sb, Tb)
        if masked:
            keep = causal_keep(i, j, scores.shape, blocks, keys_first=True)
            scores = jnp.where(keep, scores, MASKED)
        weights = jnp.exp(scores - lse_ref[:1, :])  # P^T
        dv_acc[...] += mxu_dot(weights.astype(do.dtype), do)  # P^T dO, (Sb, H)
        d_weights = mxu_dot(v_ref[...], do, contract_last=True)  # dP^T = V dO^T
        d_scores = weights * (d_weights - delta_ref[:1, :])  # dS^T
        dk_acc[...] += mxu_dot(d_scores.astype(q.dtype), q)  # dS^T Q / sqrt(H), (Sb, H)

    on_visible_blocks(i, j, blocks, step)

    @pl.when(r == pl.num_programs(3) - 1)
    def _finish():
        dk_ref[...] = dk_acc[...].astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


def block_counts(T: int, S: int, blocks: Blocks) -> dict[str, int]:
    """What the forward kernel's grid does for one (batch element, query head): its steps,
    the blocks it computes (those it masks among them) and the key blocks it fetches (a
    step fetches when its key/value block differs from the step before), from the same
    functions the kernel and its index map call, evaluated over the whole grid."""
    n_query_blocks, n_key_blocks = T // blocks.block_q, S // blocks.block_k
    i, j = np.meshgrid(np.arange(n_query_blocks), np.arange(n_key_blocks), indexing="ij")
    computed = np.broadcast_to(is_visible(i, j, blocks), i.shape)
    masked = np.broadcast_to(needs_mask(i, j, blocks), i.shape)
    fetch = np.asarray(key_block_to_fetch(i, j, blocks)).ravel()  # in grid order, j fastest
    return {
        "steps": int(i.size),
        "computed": int(computed.sum()),
        "masked": int(masked.sum()),
        "fetched": 1 + int(np.count_nonzero(fetch[1:] != fetch[:-1])),
    }
