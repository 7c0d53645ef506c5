"""Which attention implementations run on this backend, and proof that cuDNN's kernel ran.

Nothing here falls back silently: a refusal is caught, its error text is kept, and the
record says what ran instead.
"""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxloops.attention import attention
from jaxloops.blockwise import blockwise_attention
from jaxloops.measure.compiled import calls_target, compile_call

IMPLEMENTATIONS = ("naive", "xla", "blockwise", "cudnn")
# Prefix of the custom-call targets of cuDNN's fused attention, e.g. "__cudnn$fmhaSoftmax"
# (see _custom_name_maps in jax/_src/cudnn/fused_attention_stablehlo.py).
CUDNN_FMHA_TARGET = "__cudnn$fmha"


def attention_fn(
    implementation: str, *, is_causal: bool = False, block_size: int | None = None
) -> Callable:
    """The function behind an implementation name: (query, key, value) -> (B, T, N, H).

    The same request returns the same function object, so jit reuses its compilation.
    block_size is blockwise's (None: its default tiling, `blockwise.default_blocks`).
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"unknown implementation {implementation!r}; expected one of {IMPLEMENTATIONS}"
        )
    # Only blockwise has a block size; dropping it elsewhere keeps one function per request.
    return _attention_fn(
        implementation, is_causal, block_size if implementation == "blockwise" else None
    )


@functools.cache
def _attention_fn(implementation: str, is_causal: bool, block_size: int | None) -> Callable:
    if implementation == "naive":
        return functools.partial(attention, is_causal=is_causal)
    if implementation == "blockwise":
        return functools.partial(blockwise_attention, is_causal=is_causal, block_size=block_size)
    return functools.partial(
        jax.nn.dot_product_attention, is_causal=is_causal, implementation=implementation
    )


def uses_cudnn_kernel(fn: Callable, *args) -> bool:
    """True if the compiled program of `jax.jit(fn)(*args)` calls cuDNN's fused attention.

    The compiled program, not the lowered one: it is what runs, and under several devices
    the lowered call hides behind a partitioning wrapper.
    """
    return calls_target(compile_call(fn, *args), CUDNN_FMHA_TARGET)


def _missing_kernel_error(fn: Callable, *args) -> str:
    lowered = CUDNN_FMHA_TARGET in jax.jit(fn).lower(*args).as_text()
    where = "the lowered program has it, the compiled one does not" if lowered else "nor lowered"
    return f"no {CUDNN_FMHA_TARGET}* call in the compiled program ({where})"


def _first_line(error: Exception) -> str:
    lines = str(error).strip().splitlines() or [""]
    return f"{type(error).__name__}: {lines[0]}"


def run_attention(
    implementation: str,
    query,
    key,
    value,
    *,
    is_causal: bool = False,
    block_size: int | None = None,
):
    """Runs one implementation, reporting a refusal instead of raising it.

    Returns:
      (output or None, record) with record keys implementation, dtype, head_dim, works,
      cudnn_kernel (whether the compiled program calls cuDNN's fused attention) and error ("" if
      it worked). A cuDNN request whose program lacks the cuDNN call counts as not working.
    """
    fn = attention_fn(implementation, is_causal=is_causal, block_size=block_size)
    record = {
        "implementation": implementation,
        "dtype": jnp.dtype(query.dtype).name,
        "head_dim": int(query.shape[-1]),
        "works": True,
        "cudnn_kernel": False,
        "error": "",
    }
    try:
        output = jax.block_until_ready(jax.jit(fn)(query, key, value))
        # Only a cuDNN request lowers to the custom call; the others are plain jnp ops.
        if implementation == "cudnn":
            record["cudnn_kernel"] = uses_cudnn_kernel(fn, query, key, value)
    # cuDNN refuses with RuntimeError (no cuDNN), NotImplementedError (dtype, head dim),
    # ValueError (shapes) or an XLA error at compile time (versions): report them all.
    except Exception as error:  # noqa: BLE001
        record.update(works=False, error=_first_line(error))
        return None, record
    if implementation == "cudnn" and not record["cudnn_kernel"]:
        record.update(works=False, error=_missing_kernel_error(fn, query, key, value))
        return None, record
    return output, record


def attention_with_fallback(
    implementation: str,
    query,
    key,
    value,
    *,
    fallback: str = "xla",
    is_causal: bool = False,
    block_size: int | None = None,
):
    """Runs `implementation`; if it refuses, runs `fallback` and says so in the record.

    Returns:
      (output, record): record has requested, ran, error and cudnn_kernel.
    """
    output, record = run_attention(
        implementation, query, key, value, is_causal=is_causal, block_size=block_size
    )
    ran = implementation
    if not record["works"]:
        output, fallback_record = run_attention(
            fallback, query, key, value, is_causal=is_causal, block_size=block_size
        )
        ran = fallback if fallback_record["works"] else "nothing"
    return output, {
        "requested": implementation,
        "ran": ran,
        "dtype": record["dtype"],
        "error": record["error"],
        "cudnn_kernel": record["cudnn_kernel"],
    }


def default_cases(head_dim: int = 64) -> tuple[tuple[str, str, int], ...]:
    """(implementation, dtype, head dim) cases for `implementation_report`.

    The pure-JAX implementations in float32; the library kernels in float32, bfloat16 and
    float16; and cuDNN at two head dims it refuses: 36 (not a multiple of 8) and 320
    (above its limit: 256 on Hopper and later, 128 before).
    """
    cases = [("naive", "float32", head_dim), ("blockwise", "float32", head_dim)]
    cases += [
        (name, dtype, head_dim)
        for name in ("xla", "cudnn")
        for dtype in ("float32", "bfloat16", "float16")
    ]
    cases += [("cudnn", "bfloat16", 36), ("cudnn", "bfloat16", 320)]
    return tuple(cases)


def implementation_report(
    cases=None,
    *,
    batch: int = 1,
    length: int = 256,
    heads: int = 4,
    fallback: str = "xla",
    block_size: int | None = None,
) -> list[dict]:
    """Which implementations work on the current backend, one row per case.

    Args:
      cases: (implementation, dtype name, head dim) triples; default `default_cases()`.
      batch, length, heads: the (B, L, N) of the small random problem each case runs.
      fallback: what a page runs instead of a case that does not work.

    Returns:
      Rows of `run_attention`'s record plus ran_instead ("" when the case worked).
    """
    rows = []
    for implementation, dtype, head_dim in cases or default_cases():
        rng = np.random.default_rng(0)
        query, key, value = jnp.asarray(
            rng.standard_normal((3, batch, length, heads, head_dim), np.float32), dtype
        )
        _, record = run_attention(implementation, query, key, value, block_size=block_size)
        record["ran_instead"] = ""
        if not record["works"]:
            _, fallback_record = run_attention(fallback, query, key, value)
            record["ran_instead"] = fallback if fallback_record["works"] else "nothing"
        rows.append(record)
    return rows
