"""Attention sweeps: cost, latency, numerics, causal speedup and decode.

Each returns a plain list of dicts, so the chapters and a GPU benchmark script call the
same code. Timings use `interleaved_samples` (the calls of a sweep in turns, each after an
untimed call of its own, block_until_ready, median); none is a test.
"""

import functools
import math
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from jaxloops.attention import attention, causal_mask, softmax
from jaxloops.blockwise import (
    Tiling,
    blockwise_attention,
    choose_tiling,
    heads_per_step,
    online_softmax_step,
    tile_scores,
)
from jaxloops.kvcache import decode_attention
from jaxloops.measure.compiled import compiled_costs, compiled_fusions
from jaxloops.measure.kernels import attention_fn, run_attention
from jaxloops.measure.roofline import samples_beside_ceiling
from jaxloops.measure.timing import (
    calls_per_sample,
    interleaved_samples,
    paired_ratio,
    paired_wins,
    queued,
)

MATERIALISING = ("naive", "xla")  # implementations that build the (B, N, T, S) scores


def reference_attention(query, key, value, *, is_causal: bool = False) -> np.ndarray:
    """Attention in NumPy float64, the yardstick for numerical error.

    Args:
      query: (B, T, N, H); key, value: (B, S, K, H). Cast to float64 exactly as given.

    Returns:
      (B, T, N, H) float64.
    """
    q, k, v = (np.asarray(x).astype(np.float64) for x in (query, key, value))
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    q = q.reshape(B, T, K, N // K, H)  # (B, T, K, G, H)
    scores = np.einsum("BTKGH,BSKH->BKGTS", q, k) / math.sqrt(H)  # (B, K, G, T, S)
    if is_causal:
        scores = np.where(np.asarray(causal_mask(T, S)), scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    out = np.einsum("BKGTS,BSKH->BTKGH", weights, v)  # (B, T, K, G, H)
    return out.reshape(B, T, N, H)


def random_qkv(
    key: jax.Array,
    *,
    batch: int,
    length: int,
    heads: int,
    head_dim: int,
    kv_heads: int | None = None,
    dtype="float32",
):
    """Standard-normal query (B, T, N, H) and key/value (B, S, K, H), T = S = length, in `dtype`.

    Drawn with NumPy seeded from `key`: jax.random would compile a new sampler for every shape
    of the sweep, which on a CPU costs more than some of the attention calls it feeds.
    """
    kv_heads = heads if kv_heads is None else kv_heads
    rng = np.random.default_rng(np.asarray(jax.random.key_data(key)))
    draw = lambda n: jnp.asarray(
        rng.standard_normal((batch, length, n, head_dim), np.float32), dtype
    )
    return draw(heads), draw(kv_heads), draw(kv_heads)


def attention_sweep(
    key: jax.Array,
    lengths,
    requests,
    *,
    batch: int,
    heads: int,
    head_dim: int,
    block_size: int | None,
    repeats: int,
    materialise_max_length: int,
    parallel_blocks: int | None = None,
    min_sample_seconds: float | None = None,
) -> list[dict]:
    """Temporary bytes, FLOPs, bytes accessed and latency of each request at each T = S.

    Args:
      requests: (implementation, dtype) or (implementation, dtype, is_causal) tuples.
      block_size, parallel_blocks: blockwise's (None: its default tiling for that T).
      min_sample_seconds: None, a sample is one call; else each sample is as many calls,
        queued back to back, as make it this long (a GPU kernel of microseconds), and
        `samples` and `seconds` are per call (`calls_per_sample` says how many).

    One compile per point serves all the compiled measurements, and the timed calls of the
    requests alternate (`interleaved_samples`), so that a slow moment of a shared machine
    hits all of them alike, each after an untimed call of its own, so that none pays for
    the one before it; `samples` keeps every timed call in that order, `seconds` is their
    median. FLOPs and bytes are None for blockwise and cuDNN: XLA's cost analysis counts a
    loop body once, not once per trip, and does not see into a fused kernel. A request that
    does not run gets seconds None and the reason in `error`; naive and XLA, which build the
    (T, S) scores, are compiled but not run beyond `materialise_max_length`.
    """
    rows = []
    for length in lengths:
        qkv, timed = {}, []
        for name, dtype, *causal in requests:
            if dtype not in qkv:
                qkv[dtype] = random_qkv(
                    key, batch=batch, length=length, heads=heads, head_dim=head_dim, dtype=dtype
                )
            row = _point_row(name, dtype, length, bool(causal and causal[0]))
            rows.append(row)
            fn = attention_fn(name, is_causal=row["is_causal"], block_size=block_size)
            if name == "blockwise" and parallel_blocks is not None:
                fn = functools.partial(fn, parallel_blocks=parallel_blocks)
            run = _prepare_point(row, fn, qkv[dtype], materialise_max_length, block_size)
            if run is not None:
                timed.append((row, run))
        _time_points(timed, repeats, min_sample_seconds)
    return rows


def _point_row(name: str, dtype: str, length: int, is_causal: bool) -> dict:
    """An `attention_sweep` row before anything is measured."""
    measured = ("temp_bytes", "flops", "bytes_accessed", "seconds", "calls_per_sample")
    row = {"implementation": name, "dtype": dtype, "T": int(length), "is_causal": is_causal}
    return {**row, **dict.fromkeys(measured), "samples": [], "cudnn_kernel": False, "error": ""}


def _time_points(timed: list, repeats: int, min_sample_seconds: float | None) -> None:
    """Times the (row, run) pairs in turn (`interleaved_samples`) and fills each row's
    samples (per call), median and calls per sample."""
    calls = [calls_per_sample(run, min_sample_seconds) if min_sample_seconds else 1
             for _, run in timed]  # fmt: skip
    runs = {str(i): queued(run, n) for i, ((_, run), n) in enumerate(zip(timed, calls))}
    samples = interleaved_samples(runs, repeats)
    for i, ((row, _), n) in enumerate(zip(timed, calls)):
        row["samples"] = [seconds / n for seconds in samples[str(i)]]
        row["seconds"] = statistics.median(row["samples"])
        row["calls_per_sample"] = n


def _prepare_point(row: dict, fn, args, materialise_max_length: int, block_size: int | None):
    """Fills `row` with what one compile of fn(*args) says and returns the call to time, or
    None (with the reason in row["error"]) when it is not to be run.

    One checked run first: it compiles (and warms up), and catches a refusal with its text.
    """
    name = row["implementation"]
    if name in MATERIALISING and row["T"] > materialise_max_length:
        row.update(compiled_costs(fn, *args))
        row["error"] = f"not run: needs {row['temp_bytes'] / 2**30:.3g} GiB of scratch"
        return None
    _, record = run_attention(name, *args, is_causal=row["is_causal"], block_size=block_size)
    if not record["works"]:
        row["error"] = record["error"]
        return None
    row.update(compiled_costs(fn, *args), cudnn_kernel=record["cudnn_kernel"])
    if name not in MATERIALISING:  # a loop body (blockwise) or a fused kernel (cuDNN)
        row["flops"] = row["bytes_accessed"] = None
    return functools.partial(jax.jit(fn), *args)


def softmax_without_exp(scores, axis: int = -1):
    """`attention.softmax` with its exponential replaced by 1 / (1 - x): the control pass.

    The same reductions (max, sum), the same passes and the same bytes read and written; no
    transcendental. (A cheaper op, x * x, would not do: XLA recomputes so cheap an op in
    each consumer instead of writing it, and the bytes change; XLA 0.12.1 does so with this
    division too where rows are a few keys long, not at rows of 128 keys or more.) Its
    weights are not a softmax: only its time is of use.
    """
    shifted = scores - scores.max(axis=axis, keepdims=True)  # <= 0, so 1 - shifted >= 1
    weights = 1.0 / (1.0 - shifted)  # where softmax has jnp.exp(shifted)
    return weights / weights.sum(axis=axis, keepdims=True)


def naive_attention_parts(key: jax.Array, *, T: int, heads: int, head_dim: int, repeats: int):
    """A profile of naive attention by parts: each of its moves compiled and timed alone.

    Returns:
      Rows (part, flops, bytes_accessed, transcendentals, seconds) for the scores matmul,
      the softmax (scale, max, exponentials, sum, divide), the mix matmul and the whole
      program, T = S, B = 1; and two controls: the softmax with its exponential replaced by
      1 / (1 - x) (`softmax_without_exp`: same passes and bytes, no exponential), and a square
      float32 matmul of the scores matmul's FLOPs (the roofline's kind of work). The timed
      calls alternate between all of them.
    """
    query, key_, value = random_qkv(key, batch=1, length=T, heads=heads, head_dim=head_dim)
    scores = jax.jit(lambda q, k: jnp.einsum("BTNH,BSNH->BNTS", q, k))(query, key_)  # (B, N, T, S)
    scale = 1.0 / math.sqrt(head_dim)
    n = round((T * T * heads * head_dim) ** (1 / 3))  # n^3 = T S N H multiply-adds
    square = jnp.asarray(np.random.default_rng(0).standard_normal((n, n), np.float32))
    parts = {
        "scores: Q Kᵀ": (lambda q, k: jnp.einsum("BTNH,BSNH->BNTS", q, k), (query, key_)),
        "softmax": (lambda s: softmax(s * scale), (scores,)),
        "mix: weights V": (lambda w, v: jnp.einsum("BNTS,BSNH->BTNH", w, v), (scores, value)),
        "whole (naive)": (attention, (query, key_, value)),
        "control: softmax, exp → 1 / (1 - x)": (
            lambda s: softmax_without_exp(s * scale),
            (scores,),
        ),
        "control: square matmul, FLOPs of Q Kᵀ": (jnp.matmul, (square, square)),
    }
    return _timed_parts(parts, repeats)


def _timed_parts(parts: dict, repeats: int) -> list[dict]:
    """Rows (part, compiled costs, samples, seconds) of {part: (function, arguments)}, the
    parts timed in turns (`interleaved_samples`), `seconds` the median of each."""
    rows = [{"part": part, **compiled_costs(fn, *args)} for part, (fn, args) in parts.items()]
    samples = interleaved_samples(
        {part: functools.partial(jax.jit(fn), *args) for part, (fn, args) in parts.items()}, repeats
    )
    for row in rows:
        row["samples"] = samples[row["part"]]
        row["seconds"] = statistics.median(row["samples"])
    return rows


def blockwise_tile_parts(
    key: jax.Array,
    *,
    T: int,
    heads: int,
    head_dim: int,
    block_size: int,
    parallel_blocks: int,
    repeats: int,
) -> list[dict]:
    """A profile of blockwise attention by parts: one step's moves compiled and timed alone.

    A step is what one trip of the key loop handles at T = S (B = 1, K = N = heads): per_step
    tiles (from `heads_per_step`) of Tq query rows against Sb keys (`choose_tiling`).
    Each part is timed per step and multiplied by the number of steps,
    ceil(T / Tq) * heads / per_step * ceil(T / Sb). In the same rotation: the whole
    `blockwise_attention` call at T = S, and a square float32 matmul scaled to the same FLOPs
    (the last two rows).

    Returns:
      Rows (part, flops, bytes_accessed, transcendentals, seconds_per_call, seconds).
    """
    tiling = choose_tiling(T, T, False, block_size, parallel_blocks)
    Tq, Sb = tiling.Tq, tiling.Sb
    per_step = heads_per_step(heads, Tq)
    n_steps = -(-T // Tq) * (heads // per_step) * -(-T // Sb)
    rng = np.random.default_rng(np.asarray(jax.random.key_data(key)))
    draw = lambda *shape: jnp.asarray(rng.standard_normal(shape, np.float32))
    whole = functools.partial(
        blockwise_attention, block_size=block_size, parallel_blocks=parallel_blocks
    )
    parts = {  # part: (function, arguments, calls per attention call)
        **_tile_step_parts(draw, T, Tq, Sb, per_step, head_dim, n_steps),
        "whole (blockwise)": (
            whole,
            random_qkv(key, batch=1, length=T, heads=heads, head_dim=head_dim),
            1,
        ),
    }
    # The roofline's own kind of work, timed in the same rotation: one square matmul, scaled
    # to attention's FLOPs (4 T^2 N H). Its ratio to the whole call does not move with the
    # machine's speed of the moment, as a ratio to a ceiling measured earlier can.
    n = round((2 * T * T * heads * head_dim) ** (1 / 3))
    square = draw(n, n)
    parts["square matmul, same FLOPs"] = (
        jnp.matmul,
        (square, square),
        4 * T * T * heads * head_dim / (2 * n**3),
    )
    rows = _timed_parts({part: (fn, args) for part, (fn, args, _) in parts.items()}, repeats)
    for row, (_, _, calls) in zip(rows, parts.values()):
        row["calls"] = calls
        row["seconds_per_call"] = row["seconds"]
        row["seconds"] = row["seconds_per_call"] * calls
        for name in ("flops", "bytes_accessed", "transcendentals"):
            row[name] *= row["calls"]
    whole_row = next(row for row in rows if row["part"] == "whole (blockwise)")
    whole_row["flops"] = whole_row["bytes_accessed"] = whole_row["transcendentals"] = None
    return rows


def _tile_step_parts(draw, T: int, Tq: int, Sb: int, per_step: int, head_dim: int, n_steps):
    """The moves of one key-loop step on `per_step` (Tq, Sb) tiles: {part: (function,
    arguments, calls per attention call)}, inputs drawn with `draw(*shape)`."""
    query, key_, value = (
        draw(per_step, Tq, head_dim),
        draw(per_step, Sb, head_dim),
        draw(per_step, Sb, head_dim),
    )
    tiling = Tiling(T, T, Tq, Sb, False)
    step_scores = lambda q, k: tile_scores(q, k, 0, 0, tiling)
    scores = jax.jit(step_scores)(query, key_)  # (per_step, Tq, Sb)
    carry = (
        jnp.full((per_step, Tq), -1e30, jnp.float32),
        jnp.zeros((per_step, Tq), jnp.float32),
        jnp.zeros((per_step, Tq, head_dim), jnp.float32),
    )
    mix = lambda p, v: jnp.einsum("...RS,...SH->...RH", p, v)
    return {
        "scores: Q Kᵀ": (step_scores, (query, key_), n_steps),
        "online softmax step (all of it)": (online_softmax_step, (carry, scores, value), n_steps),
        "  of which P V": (mix, (scores, value), n_steps),
    }


def numerics_table(
    key: jax.Array,
    implementations,
    dtypes,
    *,
    batch: int,
    length: int,
    heads: int,
    head_dim: int,
    block_size: int,
) -> list[dict]:
    """Error of each implementation in each dtype against a float64 reference.

    The reference sees the same (rounded) inputs, so the error is the computation's alone.
    """
    rows = []
    for dtype in dtypes:
        qkv = random_qkv(
            key, batch=batch, length=length, heads=heads, head_dim=head_dim, dtype=dtype
        )  # query, key, value: the PRNG `key` must not be shadowed by the attention key
        expected = reference_attention(*qkv)
        for name in implementations:
            output, record = run_attention(name, *qkv, block_size=block_size)
            row = {
                "implementation": name,
                "dtype": dtype,
                "max_abs_error": None,
                "rms_error": None,
                "error": record["error"],
            }
            if output is not None:
                diff = np.asarray(output).astype(np.float64) - expected
                row["max_abs_error"] = float(np.abs(diff).max())
                row["rms_error"] = float(np.sqrt(np.mean(diff**2)))
            rows.append(row)
    return rows


def causal_sweep(key: jax.Array, lengths, implementations, *, dtype, **shape) -> list[dict]:
    """Full vs causal latency of each implementation at each T = S, and the speedup.

    Args:
      shape: `attention_sweep`'s keyword arguments (batch, heads, head_dim, block_size,
        repeats, materialise_max_length, parallel_blocks), passed to it unchanged.

    The full and causal calls alternate, so each repeat gives one paired ratio
    full / causal taken moments apart; `speedup` is the median of those ratios,
    `speedup_low`, `speedup_high` their smallest and largest, and `causal_wins` the number
    of them above 1 (of `rounds`).
    """
    requests = [(name, dtype, is_causal) for name in implementations for is_causal in (False, True)]
    sweep = attention_sweep(key, lengths, requests, **shape)
    rows = []
    for full, causal in zip(sweep[0::2], sweep[1::2]):
        ratios = [f / c for f, c in zip(full["samples"], causal["samples"])]
        rows.append(
            {
                "implementation": full["implementation"],
                "dtype": dtype,
                "T": full["T"],
                "full_seconds": full["seconds"],
                "causal_seconds": causal["seconds"],
                "speedup": paired_ratio(full["samples"], causal["samples"]) if ratios else None,
                "speedup_low": min(ratios) if ratios else None,
                "speedup_high": max(ratios) if ratios else None,
                # The book's rule for "causal is faster" (`faster_rounds`): wins of rounds.
                "causal_wins": paired_wins(causal["samples"], full["samples"]) if ratios else None,
                "rounds": len(ratios),
                "full_flops": full["flops"],
                "causal_flops": causal["flops"],
                "error": full["error"] or causal["error"],
            }
        )
    return rows


def random_cache(key: jax.Array, batch: int, length: int, kv_heads: int, head_dim: int, dtype):
    """A heads-major (B, K, S, H) cache of random values: 256 random slots, tiled."""
    slots = min(length, 256)
    tile = np.random.default_rng(np.asarray(jax.random.key_data(key))).standard_normal(
        (batch, kv_heads, slots, head_dim), np.float32
    )
    repeats = -(-length // slots)
    # Tiled in NumPy (eager jnp would compile per shape), in the dtype jnp.asarray would give.
    tile = tile.astype(jax.dtypes.canonicalize_dtype(dtype))
    tiled = np.tile(tile, (1, 1, repeats, 1))[:, :, :length]
    return jax.device_put(tiled)  # (B, K, S, H)


@jax.jit
def _decode_steps(queries, cache_key, cache_value):
    """Decode steps of queries (steps, B, 1, N, H), each against the whole (B, K, S, H) cache."""
    start = cache_key.shape[2] - 1  # the last slot: every query reads the whole cache
    return jax.lax.map(lambda q: decode_attention(q, cache_key, cache_value, start), queries)


def decode_sweep(
    key: jax.Array,
    cache_lengths,
    kv_heads,
    *,
    batch: int,
    heads: int,
    head_dim: int,
    dtype,
    repeats: int,
    steps: int,
) -> list[dict]:
    """Latency of one decode step (T = 1 against S cached tokens) for each K and S.

    One timed call runs `steps` decode steps (a `lax.map` over `steps` queries, all reading
    the same cache), so the time per step is the call's time / steps, with the per-call
    overhead spread thin. At each S the timed calls of the K values alternate, with the
    roofline's matmul and read (`samples_beside_ceiling`, which raises the build's ceilings).

    Returns:
      Rows with K, S, seconds (per step, median of `repeats` calls), cache_bytes (the K
      and V arrays one step reads), bytes_per_second and flops (4 * B * N * S * H, the two
      products of every query head with every cached key and value).
    """
    if steps < 1 or repeats < 1:
        raise ValueError(f"need steps >= 1 and repeats >= 1, got {steps}, {repeats}")
    queries = random_qkv(
        key, batch=steps * batch, length=1, heads=heads, head_dim=head_dim, dtype=dtype
    )[0].reshape(steps, batch, 1, heads, head_dim)  # (steps, B, 1, N, H)
    rows = []
    for length in cache_lengths:
        caches = {
            kv: tuple(
                random_cache(jax.random.fold_in(key, i), batch, length, kv, head_dim, dtype)
                for i in (1, 2)
            )
            for kv in kv_heads
        }  # (B, K, S, H) each
        runs = {
            kv: functools.partial(_decode_steps, queries, *kv_cache)
            for kv, kv_cache in caches.items()
        }
        # The read ceiling sampled beside the steps: a step that reads its cache faster than
        # the build's best read so far raises it, rather than beat the floor it is held to.
        samples, _ = samples_beside_ceiling(runs, repeats, read=True)
        for kv, (cache_key, cache_value) in caches.items():
            median = statistics.median(samples[kv]) / steps
            cache_bytes = cache_key.nbytes + cache_value.nbytes
            rows.append(
                {
                    "K": int(kv),
                    "S": int(length),
                    "seconds": median,
                    "cache_bytes": int(cache_bytes),
                    "bytes_per_second": cache_bytes / median,
                    "flops": 4 * batch * heads * length * head_dim,
                }
            )
        del caches
    return rows


def _whole_array_transposes(fn, args, elements: int) -> int:
    """Fusions of the compiled `jax.jit(fn)(*args)` that transpose or copy `elements` values."""
    fusions = compiled_fusions(fn, *args)
    moves = [f for f in fusions if "transpose" in f["ops"] or f["ops"] == "copy"]
    return sum(f["elements"] == elements for f in moves)


def _in_layout(fn, takes: str, stored: str):
    """fn(query, key, value) on a cache stored `stored`, transposed first if fn `takes` other."""
    if takes == stored:
        return fn
    return lambda q, k, v: fn(
        q, k.swapaxes(1, 2), v.swapaxes(1, 2)
    )  # (B, K, S, H) <-> (B, S, K, H)


def decode_layout_control(
    key: jax.Array,
    *,
    batch: int,
    length: int,
    heads: int,
    head_dim: int,
    dtype,
    repeats: int,
) -> list[dict]:
    """One MHA decode step (T = 1, K = N, S = length), function and cache layout swapped apart.

    Four calls, timed in turns: `decode_attention` and the general `attention`, each on a
    cache stored heads-major (B, K, S, H) and on one stored (B, S, K, H). A function given
    the layout it does not take gets a transpose inside the timed call, so the layout's
    cost is measured with the function held fixed, and the function's with the layout held
    fixed.

    Returns:
      Rows (function, layout, seconds: median of `repeats`, samples, transposes: fusions of
      the compiled step that transpose or copy a whole cache, difference: max |output -
      the first case's output|, which only rounding should make nonzero).
    """
    query = random_qkv(key, batch=batch, length=1, heads=heads, head_dim=head_dim, dtype=dtype)[0]
    heads_major = tuple(
        random_cache(jax.random.fold_in(key, i), batch, length, heads, head_dim, dtype)
        for i in (1, 2)
    )  # (B, K, S, H) each
    stored = {
        "(B, K, S, H)": heads_major,
        "(B, S, K, H)": tuple(c.swapaxes(1, 2) for c in heads_major),
    }
    functions = {  # the function, and the layout it takes
        "decode_attention": (lambda q, k, v: decode_attention(q, k, v, length - 1), "(B, K, S, H)"),
        "attention": (attention, "(B, S, K, H)"),
    }
    cases = [(name, layout) for name in functions for layout in stored]
    step = {(name, layout): jax.jit(_in_layout(*functions[name], layout)) for name, layout in cases}
    runs = {case: functools.partial(step[case], query, *stored[case[1]]) for case in cases}
    samples = interleaved_samples(runs, repeats)
    reference = np.asarray(runs[cases[0]](), np.float64)
    return [
        {
            "function": case[0],
            "layout": case[1],
            "seconds": statistics.median(samples[case]),
            "samples": samples[case],
            "transposes": _whole_array_transposes(
                step[case], (query, *stored[case[1]]), batch * heads * length * head_dim
            ),
            "difference": float(np.abs(np.asarray(runs[case](), np.float64) - reference).max()),
        }
        for case in cases
    ]
