"""Chapter 10's figures, derived from the rows that its experiments return."""

import jax
import numpy as np

from jaxloops.kvcache import attention_kind, kv_cache_bytes
from jaxloops.measure.compiled import loop_copies
from jaxloops.measure.roofline import CEILING_MARGIN
from jaxloops.measure.throughput import paired_ratio

MiB = 2**20
# How far a step may beat the floor when every cache, and the floor's own read, fit in the
# last-level cache: the floor's bandwidth is then a cached read's, and a smaller cache sits
# closer to the cores (a CI build read 1.06; others below 1).
IN_CACHE_MARGIN = 0.25


def loop_memory_rows(
    loops: dict,
    *,
    heads: int,
    head_dim: int,
    length: int,
    steps: int,
    batches,
    kv_choices,
    dtype,
) -> list[dict]:
    """Compile each decode loop for each (B, K) and read its aliased bytes, its scratch, and
    the cache-sized copies inside its loop bodies (`loop_copies`).

    Args:
      loops: name -> a jitted loop `(queries, keys, values, cache_key, cache_value, start)`.
    """

    rows = []
    for B in batches:
        for K in kv_choices:
            queries = jax.ShapeDtypeStruct((B, steps, heads, head_dim), dtype)  # (B, T, N, H)
            new = jax.ShapeDtypeStruct((B, steps, K, head_dim), dtype)  # (B, T, K, H)
            cache = jax.ShapeDtypeStruct((B, K, length, head_dim), dtype)  # (B, K, S, H)
            elements = B * K * length * head_dim
            row = {
                "kind": attention_kind(heads, K),
                "B": B,
                "K": K,
                "cache MiB (K and V)": 2 * elements * np.dtype(dtype).itemsize / MiB,
            }
            for name, loop in loops.items():
                compiled = loop.lower(queries, new, new, cache, cache, 0).compile()
                memory = compiled.memory_analysis()
                row["aliased MiB"] = memory.alias_size_in_bytes / MiB  # same for each loop
                row[f"scratch MiB, {name}"] = memory.temp_size_in_bytes / MiB
                row[f"copies, {name}"] = loop_copies(compiled, elements)
            rows.append(row)
    return rows


def in_place_figures(rows: list[dict], large_batch: int) -> dict:
    """The scratch figures the page quotes, MHA at B = `large_batch` and at B = 1."""
    at = {(row["B"], row["kind"]): row for row in rows}
    mha, mha_1 = at[large_batch, "MHA"], at[1, "MHA"]
    return {
        "b_large": large_batch,
        "mha_scratch": float(mha["scratch MiB, drop_unit_axes"]),
        "mha_cache_mib": float(mha["cache MiB (K and V)"]),
        "b1_mha_scratch": float(mha_1["scratch MiB, as given"]),
        "b1_mha_cache_mib": float(mha_1["cache MiB (K and V)"]),
        "b1_mha_loop_scratch": float(mha_1["scratch MiB, drop_unit_axes"]),
    }


def mqa_note(row: dict, large_batch: int) -> str:
    """The sentence on MQA's scratch with B = `large_batch` (`row`, from `loop_memory_rows`)."""
    scratch, cache = row["scratch MiB, drop_unit_axes"], row["cache MiB (K and V)"]
    if scratch < cache / 4:
        return f"MQA with B = {large_batch} is in place too."
    return (
        f"MQA with B = {large_batch} keeps {scratch:.0f} MiB of scratch beside its "
        f"{cache:.0f} MiB cache, but not in the loop: the compiled loop body copies no "
        f"cache-sized array (checked above), and the copy is XLA giving the (B, S, H) result "
        f"back the (B, 1, S, H) shape the caller passed in, once per call."
    )


def predicted_steps(
    roofline, *, batch: int, heads: int, head_dim: int, length: int, kv_choices, itemsize: int
) -> list[dict]:
    """One decode step's FLOPs, cache bytes and roofline prediction for each K."""
    rows = []
    for kv_heads in kv_choices:
        flops = 4 * batch * heads * length * head_dim
        cache_bytes = 2 * batch * kv_heads * length * head_dim * itemsize
        rows.append(
            {
                "kind": attention_kind(heads, kv_heads),
                "K": kv_heads,
                "GFLOP": flops / 1e9,
                "cache MiB": cache_bytes / MiB,
                "FLOPs per byte": flops / cache_bytes,
                "predicted ms": roofline.predict(flops, cache_bytes) * 1e3,
                "bound": roofline.bound(flops, cache_bytes),
            }
        )
    return rows


def prediction_figures(predicted: list[dict], roofline, length: int) -> dict:
    """The prediction's figures for MHA, GQA and MQA (the rows in that order)."""
    figures = {
        "roof_gflops": float(roofline.flops_per_s / 1e9),
        "roof_gbs": float(roofline.bytes_per_s / 1e9),
        "ridge": float(roofline.ridge),
        "S_max": length,
    }
    for name, row in zip(("mha", "gqa", "mqa"), predicted):
        figures[f"intensity_{name}"] = float(row["FLOPs per byte"])
        figures[f"pred_{name}"] = float(row["predicted ms"])
        figures[f"bound_{name}"] = row["bound"]
    return figures


def decode_table(decode: list[dict], heads: int) -> list[dict]:
    """The sweep's rows as the page's table: measured against predicted."""
    return [
        {
            "S": r["S"],
            "kind": attention_kind(heads, r["K"]),
            "K": r["K"],
            "cache MiB": r["cache_bytes"] / MiB,
            "predicted ms": r["predicted"] * 1e3,
            "measured ms": r["seconds"] * 1e3,
            "measured / predicted": r["seconds"] / r["predicted"],
        }
        for r in decode
    ]


def decode_figures(decode: list[dict], roofline, kv_choices, length: int) -> dict:
    """MHA, GQA and MQA (`kv_choices` in that order) at S = `length`: times, ratios, rates."""
    at = {(r["K"], r["S"]): r for r in decode}
    missing = [k for k in kv_choices if (k, length) not in at]
    if missing:
        raise ValueError(f"the sweep has no row at S = {length} for K in {missing}")
    mha, gqa, mqa = (at[k, length] for k in kv_choices)
    figures = {}
    for name, row in (("mha", mha), ("gqa", gqa), ("mqa", mqa)):
        figures[f"{name}_ms"] = float(row["seconds"] * 1e3)
        figures[f"{name}_vs_pred"] = float(row["seconds"] / row["predicted"])
    figures.update(
        mha_over_gqa=float(mha["seconds"] / gqa["seconds"]),
        mha_over_mqa=float(mha["seconds"] / mqa["seconds"]),
        bytes_ratio=float(mha["cache_bytes"] / mqa["cache_bytes"]),
        bytes_ratio_gqa=float(mha["cache_bytes"] / gqa["cache_bytes"]),
        mha_gbs=float(mha["bytes_per_second"] / 1e9),
        mqa_gflops=float(mqa["flops"] / mqa["seconds"] / 1e9),
        mqa_flops_share=float(mqa["flops"] / mqa["seconds"] / roofline.flops_per_s),
    )
    return figures


def floor_rows(decode: list[dict], llc: int | None, length: int):
    """(past, within, by_size): the steps whose cache comes from memory, those that fit in
    the last-level cache `llc`, and whether `past` was chosen by size. By size, `past` is
    the caches over twice `llc`; where `llc` is None or no cache is that large, it is the
    steps at S = `length` (left out of `within`)."""
    past = [r for r in decode if llc and r["cache_bytes"] > 2 * llc]
    within = [r for r in decode if llc and r["cache_bytes"] <= llc]
    if past:
        return past, within, True
    past = [r for r in decode if r["S"] == length]
    return past, [r for r in within if r["S"] != length], False


def floor_figures(decode: list[dict], llc: int | None, length: int, heads: int) -> dict:
    """The fastest step against its floor where the cache comes from memory, the margin it
    is held to ("floor_margin": the roofline's `CEILING_MARGIN`, or `IN_CACHE_MARGIN` where
    every cache fits in the last-level cache), and a note on the fastest of those that fit.

    A cache past the last-level cache is held to a floor for its bytes beyond it: at best
    the last-level cache serves `llc` bytes of each step's read, and main memory the rest."""
    past, within, by_size = floor_rows(decode, llc, length)
    if not past:
        raise ValueError(
            f"no step's cache is past the last-level cache ({llc} bytes) or at S = {length}"
        )
    share = lambda r: r["predicted"] / r["seconds"]  # noqa: E731
    beyond = (lambda r: share(r) * (1 - llc / r["cache_bytes"])) if by_size else share
    worst = max(past, key=beyond)
    fastest = max(within, key=share, default=None)
    note = ""
    if fastest:
        note = (
            f" Caches that fit in the processor's {llc / MiB:.0f} MiB last-level cache are "
            f"left out of that check, since the floor's bandwidth is main memory's, measured "
            f"on a larger read; the fastest of them, {attention_kind(heads, fastest['K'])} "
            f"at S = {fastest['S']} ({fastest['cache_bytes'] / MiB:.0f} MiB), ran at "
            f"{share(fastest):.2f} of its floor's speed."
        )
    margin = CEILING_MARGIN
    if by_size:
        where = (
            f"more than twice the {llc / MiB:.0f} MiB last-level cache (each held to a "
            "floor for its bytes beyond that cache, which it could at best serve)"
        )
    elif llc:
        where = (f"at S = {length} (no cache here is larger than the processor's "
                 f"{llc / MiB:.0f} MiB last-level cache, nor is the floor's read, so the floor "
                 "bounds them only roughly)")  # fmt: skip
        margin = IN_CACHE_MARGIN
    else:
        where = f"at S = {length}"
    return {
        "floor_worst": float(beyond(worst)),
        "floor_worst_K": worst["K"],
        "floor_worst_S": worst["S"],
        "floor_rows": len(past),
        "floor_margin": margin,
        "cache_note": note,
        "floor_where": where,
    }


def paired_median(a: dict, b: dict) -> float:
    """Median over calls of a's time over b's, sample by sample (rows with "samples")."""
    return float(paired_ratio({"a": a["samples"], "b": b["samples"]}, "a", "b"))


def layout_figures(layout_rows: list[dict]) -> dict:
    """`decode_layout_control`'s four calls split apart: the layout alone, the function
    alone, and both at once, each against `decode_attention` on the heads-major cache."""
    cell = {(r["function"], r["layout"]): r for r in layout_rows}
    heads_major, swapped = "(B, K, S, H)", "(B, S, K, H)"
    base = cell["decode_attention", heads_major]
    return {
        "layout_alone": paired_median(cell["decode_attention", swapped], base),
        "function_alone": paired_median(cell["attention", heads_major], base),
        "general_ratio": paired_median(cell["attention", swapped], base),
        "heads_major_ms": float(base["seconds"] * 1e3),
        "general_ms": float(cell["attention", swapped]["seconds"] * 1e3),
        "general_transposes": cell["attention", swapped]["transposes"],
        "general_hm_transposes": cell["attention", heads_major]["transposes"],
        "base_transposes": base["transposes"],
        "swapped_transposes": cell["decode_attention", swapped]["transposes"],
    }


def serving_figures(
    *,
    layers: int,
    head_dim: int,
    kv_heads: int,
    mha_heads: int,
    context: int,
    free_bytes: int,
    batch: int,
    bytes_per_element: int = 2,
) -> dict:
    """Exercise 10.1's figures: a model's cache per token and per sequence, how many whole
    sequences of `context` tokens fit in `free_bytes` with K = `kv_heads` and with MHA, and
    one key/value head's cache for `batch` such sequences."""
    shape = dict(layers=layers, head_dim=head_dim, bytes_per_element=bytes_per_element)
    per_sequence = kv_cache_bytes(kv_heads=kv_heads, length=context, batch=1, **shape)
    per_sequence_mha = kv_cache_bytes(kv_heads=mha_heads, length=context, batch=1, **shape)
    return {
        "ex_kib_token": float(
            kv_cache_bytes(kv_heads=kv_heads, length=1, batch=1, **shape) / 2**10
        ),
        "ex_gib_sequence": float(per_sequence / 2**30),
        "ex_fit_gqa": free_bytes // per_sequence,
        "ex_fit_mha": free_bytes // per_sequence_mha,
        "ex_gib_per_head": kv_cache_bytes(kv_heads=1, length=context, batch=batch, **shape) / 2**30,
    }
