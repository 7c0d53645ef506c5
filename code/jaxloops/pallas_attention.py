"""Blockwise attention as a Pallas kernel: the online softmax of `jaxloops.blockwise`, with
what stays in on-chip memory chosen by hand.

The kernels run heads-major: query (B, N, T, H), key and value (B, K, S, H), the layout in
which one head's block of rows is a (rows, H) tile. `pallas_attention` takes the book's
(B, T, N, H) and transposes (layout="BTNH"), or heads-major arrays as they are
(layout="BNTH", the layout JAX's own Pallas kernels take).

The forward kernel's grid is (B, N, T / Tb, S / Sb): one step per (batch element, query
head, query block, key block), the key blocks innermost and sequential ("arbitrary"), the
rest independent ("parallel"). Each step's query, key and value tiles are copied into VMEM
by the pipeline that the `BlockSpec`s describe (two buffers each, the next step's tiles
arriving while this step computes); the running max m, sum l and output of the online
softmax stay in VMEM scratch from the first key block to the last, where the output and the
per-row log-sum-exp are written. Causal, a block wholly above the diagonal is neither
computed (`pl.when`) nor fetched: the key/value index map repeats the last block the query
block sees, and the pipeline skips a copy whose block has not changed. Grouped-query
attention reads key/value head n // G for query head n, in the index map: nothing is copied.
The backward pass (`jax.custom_vjp`) is two kernels that rebuild the weights from the saved
log-sum-exp: one walks the key blocks of each query block for dQ, the other the query blocks
(of the G query heads of a key/value head) of each key block for dK and dV.
"""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from jaxloops import rounding
from jaxloops.attention import attention_rounding_bound, check_attention_shapes
from jaxloops.pallas_kernels import (  # re-exported: what one grid step computes
    LANES,
    SUBLANES,
    Blocks,
    block_counts,
    causal_keep,
    dkv_kernel,
    dq_kernel,
    forward_kernel,
    key_block_to_fetch,
    mxu_dot,
    online_softmax_update,
    query_block_to_fetch,
)

__all__ = (
    "LANES",
    "SUBLANES",
    "Blocks",
    "agreement_bound",
    "backward",
    "block_counts",
    "block_spec",
    "causal_keep",
    "compiler_params",
    "default_block",
    "default_interpret",
    "dkv_kernel",
    "dkv_specs",
    "dq_kernel",
    "dq_specs",
    "forward",
    "forward_kernel",
    "forward_specs",
    "forward_vmem_bytes",
    "heads_major_attention",
    "key_block_to_fetch",
    "make_blocks",
    "matmul_error",
    "mxu_dot",
    "online_softmax_update",
    "pallas_attention",
    "product_error",
    "query_block_to_fetch",
    "tile_bytes",
)

DTYPES = ("float32", "bfloat16")

# The largest default block; smaller where it does not divide the length (`default_block`).
DEFAULT_BLOCK = 512


def block_spec(rows: int, width: int, index_map: Callable) -> pl.BlockSpec:
    """A (rows, width) tile of one head of a heads-major array, (B, heads, length, width),
    at the block `index_map` names for each grid step; the pipeline keeps it in VMEM."""
    return pl.BlockSpec((None, None, rows, width), index_map)


def forward_specs(blocks: Blocks, H: int, G: int):
    """The forward kernel's BlockSpecs (query, key, value in; output, log-sum-exp out) and
    its VMEM scratch (the running max, sum and output), for grid steps (b, n, i, j)."""
    Tb, Sb = blocks.block_q, blocks.block_k

    def rows(b, n, i, j):  # query head n's block i: the same for every j
        return b, n, i, 0

    def keys(b, n, i, j):  # GQA: query head n reads key/value head n // G, no copy
        return b, n // G, key_block_to_fetch(i, j, blocks), 0

    in_specs = [block_spec(Tb, H, rows), block_spec(Sb, H, keys), block_spec(Sb, H, keys)]
    out_specs = [block_spec(Tb, H, rows), block_spec(Tb, LANES, rows)]
    scratch = [pltpu.VMEM((Tb, LANES), jnp.float32)] * 2 + [pltpu.VMEM((Tb, H), jnp.float32)]
    return in_specs, out_specs, scratch


def compiler_params(blocks: Blocks) -> pltpu.CompilerParams:
    """Every grid axis but the innermost is independent ("parallel"); the innermost carries
    the accumulation from step to step ("arbitrary": in order, on one core)."""
    return pltpu.CompilerParams(
        dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
        vmem_limit_bytes=blocks.vmem_limit_bytes,
    )


def forward(query, key, value, blocks: Blocks, *, with_lse: bool = True):
    """Output (B, N, T, H) and, `with_lse`, the per-row log-sum-exp (B, N, T) float32 (else
    None) of heads-major query (B, N, T, H) and key, value (B, K, S, H)."""
    B, N, T, H = query.shape
    K, S = key.shape[1], key.shape[2]
    in_specs, out_specs, scratch = forward_specs(blocks, H, N // K)
    out_shape = [
        jax.ShapeDtypeStruct(query.shape, query.dtype),
        jax.ShapeDtypeStruct((B, N, T, LANES), jnp.float32),  # one row's value in 128 lanes
    ]
    kernel = functools.partial(forward_kernel, blocks=blocks)
    if not with_lse:  # no backward pass to come: no log-sum-exp written to HBM
        out_specs, out_shape = out_specs[:1], out_shape[:1]
        kernel = functools.partial(_without_lse, kernel)
    out, *lse = pl.pallas_call(
        kernel,
        grid=(B, N, T // blocks.block_q, S // blocks.block_k),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        scratch_shapes=scratch,
        compiler_params=compiler_params(blocks),
        interpret=blocks.interpret,
    )(query, key, value)
    return out, lse[0][..., 0] if lse else None


def _without_lse(kernel, q_ref, k_ref, v_ref, o_ref, *scratch):
    kernel(q_ref, k_ref, v_ref, o_ref, None, *scratch)


def dq_specs(blocks: Blocks, H: int, G: int):
    """dQ's BlockSpecs (query, key, value, dO, lse, D in; dQ out) and scratch; grid as forward."""
    Tb = blocks.block_q
    in_specs, _, _ = forward_specs(blocks, H, G)
    row = in_specs[0]

    def stats(b, n, i, j):  # lse and D, (B, N, 1, T): a row of Tb lanes
        return b, n, 0, i

    in_specs = [*in_specs, row, block_spec(1, Tb, stats), block_spec(1, Tb, stats)]
    return in_specs, row, [pltpu.VMEM((Tb, H), jnp.float32)]


def dkv_specs(blocks: Blocks, H: int, G: int, n_query_blocks: int):
    """dK/dV's BlockSpecs and scratch, for grid steps (b, h, j, r): key/value head h's key
    block j against query block r % nQ of its query head h * G + r // nQ."""
    Tb, Sb, nQ = blocks.block_q, blocks.block_k, n_query_blocks

    def rows(b, h, j, r):
        return b, h * G + r // nQ, query_block_to_fetch(r % nQ, j, blocks, nQ), 0

    def stats(b, h, j, r):  # lse and D, (B, N, 8, T): a row repeated in 8 sublanes
        return b, h * G + r // nQ, 0, query_block_to_fetch(r % nQ, j, blocks, nQ)

    def keys(b, h, j, r):
        return b, h, j, 0

    key_tile, row_tile, stat_tile = (
        block_spec(Sb, H, keys), block_spec(Tb, H, rows), block_spec(SUBLANES, Tb, stats)
    )  # fmt: skip
    in_specs = [row_tile, key_tile, key_tile, row_tile, stat_tile, stat_tile]
    return in_specs, [key_tile, key_tile], [pltpu.VMEM((Sb, H), jnp.float32)] * 2


def backward(blocks: Blocks, residuals, d_out):
    """dQ, dK, dV of heads-major attention from the saved (query, key, value, out, lse)."""
    query, key, value, out, lse = residuals
    B, N, T, H = query.shape
    K, S = key.shape[1], key.shape[2]
    G, nQ, nS = N // K, T // blocks.block_q, S // blocks.block_k
    d_out = d_out.astype(query.dtype)
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # D, (B, N, T)
    stats = [x[:, :, None, :] for x in (lse, delta)]  # (B, N, 1, T)
    in_specs, out_spec, scratch = dq_specs(blocks, H, G)
    d_query = pl.pallas_call(
        functools.partial(dq_kernel, blocks=blocks),
        grid=(B, N, nQ, nS),
        in_specs=in_specs, out_specs=out_spec, scratch_shapes=scratch,
        out_shape=jax.ShapeDtypeStruct(query.shape, query.dtype),
        compiler_params=compiler_params(blocks), interpret=blocks.interpret,
    )(query, key, value, d_out, *stats)  # fmt: skip
    in_specs, out_specs, scratch = dkv_specs(blocks, H, G, nQ)
    d_key, d_value = pl.pallas_call(
        functools.partial(dkv_kernel, blocks=blocks, n_query_blocks=nQ),
        grid=(B, K, nS, G * nQ),
        in_specs=in_specs,
        out_specs=out_specs,
        scratch_shapes=scratch,
        out_shape=[jax.ShapeDtypeStruct(key.shape, key.dtype)] * 2,
        compiler_params=compiler_params(blocks),
        interpret=blocks.interpret,
    )(query, key, value, d_out, *(jnp.broadcast_to(x, (B, N, SUBLANES, T)) for x in stats))
    return d_query, d_key, d_value


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def heads_major_attention(query, key, value, blocks: Blocks):
    """Attention of heads-major query (B, N, T, H), key and value (B, K, S, H), in the
    kernels `blocks` describes: (B, N, T, H). Differentiable (`backward`)."""
    return forward(query, key, value, blocks, with_lse=False)[0]


def _forward_with_residuals(query, key, value, blocks: Blocks):
    out, lse = forward(query, key, value, blocks)
    return out, (query, key, value, out, lse)  # O(T + S) residuals: no (T, S) array


heads_major_attention.defvjp(_forward_with_residuals, backward)


def default_interpret():
    """Compiled on a TPU (False); elsewhere Pallas's TPU interpreter, which runs the kernel
    on the CPU with the TPU's memory spaces, DMAs and grid order simulated."""
    return False if jax.default_backend() == "tpu" else pltpu.InterpretParams()


def default_block(length: int) -> int:
    """The largest of 512, 256, 128 that divides `length`; the length itself below 128."""
    for block in (DEFAULT_BLOCK, DEFAULT_BLOCK // 2, LANES):
        if length % block == 0:
            return block
    return length


def make_blocks(T, S, H, dtype, *, is_causal, block_q=None, block_k=None, interpret=None,
                vmem_limit_bytes=None) -> Blocks:  # fmt: skip
    """Checks the sizes against the TPU's tiling and returns the kernels' `Blocks`.

    A block divides its length and is a multiple of 128, a TPU's lane width (the last axis
    of a score tile, and the log-sum-exp row of Tb queries, lie along the lanes), or is the
    whole length when that is at most 128 (which also makes it a multiple of 8, the
    sublanes). The head dim is at most 128 or a multiple of it: the max and sum, one per row
    in 128 lanes, are broadcast across a row of H lanes.
    """
    block_q = default_block(T) if block_q is None else block_q
    block_k = default_block(S) if block_k is None else block_k
    for name, block, letter, length in (("block_q", block_q, "T", T), ("block_k", block_k, "S", S)):
        if not isinstance(block, int) or block < 1 or length % block:
            raise ValueError(f"{name} {block!r} must be a positive divisor of {letter} = {length}")
        if block % LANES and not block == length <= LANES:
            raise ValueError(
                f"{name} {block} must be a multiple of 128 (a TPU's lanes), or the whole "
                f"length {letter} = {length} when that is at most 128"
            )
    if H > LANES and H % LANES:
        raise ValueError(f"head dim H = {H} must be at most 128 or a multiple of 128")
    if jnp.dtype(dtype).name not in DTYPES:
        raise ValueError(f"dtype {jnp.dtype(dtype).name} is not one of {DTYPES}")
    if vmem_limit_bytes is not None and vmem_limit_bytes < 1:
        raise ValueError(f"vmem_limit_bytes {vmem_limit_bytes} must be positive")
    interpret = default_interpret() if interpret is None else interpret
    return Blocks(block_q, block_k, is_causal, interpret, vmem_limit_bytes)


LAYOUTS = ("BTNH", "BNTH")


@functools.partial(
    jax.jit,
    static_argnames=("is_causal", "block_q", "block_k", "layout", "interpret", "vmem_limit_bytes"),
)
def pallas_attention(query, key, value, *, is_causal: bool = False, block_q: int | None = None,
                     block_k: int | None = None, layout: str = "BTNH", interpret=None,
                     vmem_limit_bytes: int | None = None):  # fmt: skip
    """Attention as Pallas kernels, forward and backward.

    Args:
      query: (B, T, N, H); key, value: (B, S, K, H) with N % K == 0; one dtype, float32 or
        bfloat16. With layout="BNTH", heads-major: (B, N, T, H) and (B, K, S, H).
      is_causal: query t attends to keys s <= t (top-left); blocks above the diagonal are
        neither computed nor fetched.
      block_q, block_k: Tb and Sb (`make_blocks` says which are allowed). None:
        `default_block` of T and S.
      layout: "BTNH" (the book's; transposed to heads-major for the kernels) or "BNTH".
      interpret: None: `default_interpret()`; False compiles for a TPU.
      vmem_limit_bytes: the kernels' VMEM limit; None: Mosaic's default.

    Returns:
      The output in the layout and dtype of the query.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r} is not one of {LAYOUTS}")
    swap = (lambda x: x) if layout == "BNTH" else (lambda x: jnp.swapaxes(x, 1, 2))
    query, key, value = (swap(jnp.asarray(x)) for x in (query, key, value))  # heads-major
    as_book = [jnp.swapaxes(x, 1, 2) for x in (query, key, value)]  # (B, T, N, H): checked
    B, T, S, N, K, H = check_attention_shapes(*as_book)
    if not query.dtype == key.dtype == value.dtype:
        raise ValueError(
            f"dtypes differ: query {query.dtype}, key {key.dtype}, value {value.dtype}"
        )
    blocks = make_blocks(
        T, S, H, query.dtype, is_causal=is_causal, block_q=block_q, block_k=block_k,
        interpret=interpret, vmem_limit_bytes=vmem_limit_bytes,
    )  # fmt: skip
    return swap(heads_major_attention(query, key, value, blocks))


def tile_bytes(shape, dtype) -> int:
    """Bytes of a 2-D array in VMEM: its rows padded to whole sublane tiles (8 rows of 32
    bits; 16 of bfloat16, packed two to a sublane) and its columns to 128 lanes."""
    rows, cols = shape[-2:]
    itemsize = jnp.dtype(dtype).itemsize
    sublanes = SUBLANES * 4 // itemsize
    return -(-rows // sublanes) * sublanes * -(-cols // LANES) * LANES * itemsize


def forward_vmem_bytes(blocks: Blocks, H: int, dtype) -> dict[str, int]:
    """The forward kernel's VMEM, predicted from its BlockSpecs and scratch (`forward_specs`):
    every pipelined tile twice (two buffers), the scratch once, and the (Tb, Sb) temporaries
    of a step (the float32 scores and weights, the weights in the value dtype)."""
    in_specs, out_specs, scratch = forward_specs(blocks, H, 1)
    dtypes = [dtype] * 4 + [jnp.float32]  # query, key, value, output; the log-sum-exp
    specs = [*in_specs, *out_specs]
    score = (blocks.block_q, blocks.block_k)
    return {
        "tiles": sum(2 * tile_bytes(s.block_shape, d) for s, d in zip(specs, dtypes)),
        "scratch": sum(tile_bytes(s.shape, s.dtype) for s in scratch),
        "temporaries": 2 * tile_bytes(score, jnp.float32) + tile_bytes(score, dtype),
    }


def _product_kernel(a_ref, b_ref, out_ref):
    out_ref[...] = mxu_dot(a_ref[...], b_ref[...])


@functools.cache
def _matmul_error(backend: str, interpret) -> float:
    del backend  # the cache's key: measured on the backend in use
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, LANES, LANES), np.float32)
    shape = jax.ShapeDtypeStruct((LANES, LANES), jnp.float32)
    product = pl.pallas_call(_product_kernel, out_shape=shape, interpret=interpret)(a, b)
    return product_error(product, a, b)


def product_error(product, a, b) -> float:
    """max |product - A B| / (|A| |B|), elementwise, A B and |A| |B| in float64."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    error = np.abs(np.asarray(product, np.float64) - a64 @ b64) / (np.abs(a64) @ np.abs(b64))
    return float(error.max())


def matmul_error(interpret=None) -> float:
    """The largest relative error of the kernels' float32 products (`mxu_dot`) on this
    backend, |fl(A B) - A B| / (|A| |B|) elementwise over 128-term dots, measured in a Pallas
    kernel as `rounding.backend_errors` measures XLA's matmuls (cached per backend)."""
    interpret = default_interpret() if interpret is None else interpret
    return _matmul_error(jax.default_backend(), interpret)


def agreement_bound(query, key, scale, magnitude=None, *, grad=False, interpret=None) -> float:
    """The largest difference rounding explains between this kernel's output (or, `grad`, a
    gradient) and another correct attention's of the same inputs, on this backend:
    `attention_rounding_bound` with the float32 errors measured here (XLA's operations,
    with log for a gradient rebuilt through the log-sum-exp, and the kernels' own products,
    `matmul_error`), and the storage rounding of bfloat16 inputs.

    Args:
      query: (B, T, N, H); key: (B, S, K, H), in the dtype the attentions ran in.
      scale, magnitude: as `attention_rounding_bound` takes them (`rounding_magnitudes`).
    """
    ops = (*rounding.ATTENTION, "log") if grad else rounding.ATTENTION
    eps = max(rounding.backend_eps(ops), matmul_error(interpret))
    dtype = jnp.result_type(query)
    storage_eps = 0.0 if dtype == jnp.float32 else float(jnp.finfo(dtype).eps)
    return attention_rounding_bound(
        query, key, scale, eps, storage_eps=storage_eps, magnitude=magnitude
    )
