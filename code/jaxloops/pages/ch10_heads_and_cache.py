"""Chapter 10's page: head grouping and the cache's layout drawn, the decode sweep's figures,
tables and plots, and what serving a large model would keep (book/10_heads_and_cache.md)."""

import math

from jaxloops.kvcache import attention_kind, kv_cache_bytes
from jaxloops.measure.roofline import CEILING_MARGIN
from jaxloops.measure.timing import paired_ratio, paired_spread
from jaxloops.pages.ch08_attention import log2_axes
from jaxloops.pages.common import MiB
from jaxloops.pages.render import subplots

# How far a step may beat the floor when every cache, and the floor's own read, fit in the
# last-level cache: the floor's bandwidth is then a cached read's, and a smaller cache sits
# closer to the cores (a CI build read 1.06; others below 1).
IN_CACHE_MARGIN = 0.25

# The least the (B, S, K, H) layout may cost `decode_attention` where its compiled program
# transposes that cache: the transposes read and write the whole cache before the step reads
# it (this CPU: 8.9 times; a TPU v5e's program held no transpose, and both layouts took 6.5 ms).
TRANSPOSED_SLOWDOWN = 1.5
HEADS_MAJOR, SWAPPED = "(B, K, S, H)", "(B, S, K, H)"  # the layouts `decode_layout_control` stores


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


def _size_one(row: dict) -> bool:
    return row["B"] == 1 or row["K"] == 1


def _loop_figures(row: dict):
    """(cache MiB, copies as given, copies in drop_unit_axes, scratch MiB as given, scratch
    MiB in drop_unit_axes) of one `loop_memory_rows` row."""
    return (
        row["cache MiB (K and V)"],
        row["copies, as given"],
        row["copies, drop_unit_axes"],
        row["scratch MiB, as given"],
        row["scratch MiB, drop_unit_axes"],
    )


def in_place_claims(rows: list[dict]) -> dict[str, bool]:
    """What the page claims of `loop_memory_rows` (the loops "as given" and
    "drop_unit_axes"), on every backend, each tied to the cache-sized copies the compiled loop
    bodies hold (a compiler may or may not copy a cache with a size-1 axis in the loop):

    - carried in `drop_unit_axes`, every cache is aliased and no loop body copies it;
    - without a size-1 axis the two loops are one program: no copy, the same scratch;
    - where the as-given loop body copies the cache, that costs at least a cache of scratch,
      more than `drop_unit_axes` needs;
    - with B = 1, `drop_unit_axes` saves more than a whole cache of scratch exactly where the
      as-given loop copies it (and not where it does not).

    Returns:
      {the claim, with its row's numbers: whether it holds}.
    """
    claims = {}
    for row in rows:
        cache, given, looped, given_mib, loop_mib = _loop_figures(row)
        where = (
            f"{row['kind']}, B = {row['B']}: {given} and {looped} copies, {given_mib:.4g} and "
            f"{loop_mib:.4g} MiB of scratch, as given and in drop_unit_axes, beside a "
            f"{cache:.4g} MiB cache"
        )
        claims[f"drop_unit_axes aliases the cache and copies none in the loop ({where})"] = (
            row["aliased MiB"] == cache and looped == 0
        )
        if not _size_one(row):
            claims[f"without a size-1 axis both loops are one program ({where})"] = (
                given == 0 and given_mib == loop_mib
            )
        if given > 0:
            claims[f"the copy in the as-given loop costs a cache of scratch ({where})"] = (
                given_mib >= cache and given_mib > loop_mib
            )
        if row["B"] == 1:
            claims[f"B = 1 saves a cache's worth exactly where as given copies it ({where})"] = (
                given_mib - loop_mib > cache
            ) == (given > 0)
    return claims


def in_place_sentences(rows: list[dict], large_batch: int) -> dict[str, str]:
    """The page's sentences (Markdown) on `loop_memory_rows`, from what the compiled loops
    hold: "in_place_size1", the loops with a size-1 axis (whether carrying the cache as
    given copied it in the loop, and what B = 1 saved), and "in_place_large", the scratch of
    MHA's one program at B = `large_batch`."""
    figures = in_place_figures(rows, large_batch)
    size_one = [row for row in rows if _size_one(row)]
    copied = [row for row in size_one if row["copies, as given"] > 0]
    batch_one = [row for row in rows if row["B"] == 1]
    saved = [
        row
        for row in batch_one
        if row["scratch MiB, as given"] - row["scratch MiB, drop_unit_axes"]
        > row["cache MiB (K and V)"]
    ]
    mha_1 = (
        f"one sequence of MHA needs {figures['b1_mha_scratch']:.0f} MiB of scratch carried as "
        f"given and {figures['b1_mha_loop_scratch']:.1f} MiB carried in `drop_unit_axes`, "
        f"beside a {figures['b1_mha_cache_mib']:.0f} MiB cache"
    )
    if size_one and len(copied) == len(size_one):
        size1 = (
            f"The prediction holds: carried as given, every loop with a size-1 axis copies the "
            f"cache inside its body, and {mha_1}. Every loop with B = 1 saves more than its "
            f"whole cache's worth of scratch."
        )
    elif not copied:
        size1 = (
            f"Here the prediction's cause is absent, and so is its effect: carried as given, "
            f"no loop with a size-1 axis copies the cache inside its body, so "
            f"`drop_unit_axes` has no copy to save. {mha_1[0].upper()}{mha_1[1:]}, and no loop "
            f"with B = 1 saves a cache's worth of scratch."
        )
    else:
        size1 = (
            f"Carried as given, {len(copied)} of the {len(size_one)} loops with a size-1 axis "
            f"copy the cache inside their body, and {mha_1}. The {len(saved)} of "
            f"{len(batch_one)} loops with B = 1 that save more than a whole cache's worth of "
            f"scratch are those whose as-given loop copied it."
        )
    scratch, cache = figures["mha_scratch"], figures["mha_cache_mib"]
    if scratch < cache / 4:
        large = (
            f"its scratch is a small fraction of the cache (MHA, B = {large_batch}: "
            f"{scratch:.1f} MiB beside a {cache:.0f} MiB cache)"
        )
    else:
        large = (
            f"its scratch is {scratch / cache:.1f} times the cache (MHA, B = {large_batch}: "
            f"{scratch:.0f} MiB beside a {cache:.0f} MiB cache), and none of it is a copy "
            f"inside the loop body (the count above): it is paid once per call, not on every "
            f"step"
        )
    return {"in_place_size1": size1, "in_place_large": large}


def mqa_note(row: dict, large_batch: int) -> str:
    """The sentence on MQA's scratch with B = `large_batch` (`row`, from `loop_memory_rows`)."""
    scratch, cache = row["scratch MiB, drop_unit_axes"], row["cache MiB (K and V)"]
    if scratch < cache / 4:
        return f"MQA with B = {large_batch} is in place too."
    kept = (
        f"MQA with B = {large_batch} keeps {scratch:.0f} MiB of scratch beside its "
        f"{cache:.0f} MiB cache"
    )
    if row["scratch MiB, as given"] == scratch:
        return (
            f"{kept}, as much as carried as given, so none of it is `drop_unit_axes`'s; and "
            f"none of it is a copy inside the loop body (checked above): it is paid once per "
            f"call, not on every step."
        )
    return (
        f"{kept}, but not in the loop: the compiled loop body copies no "
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
            f"left out of that check: the floor's bandwidth is that of a larger read, and a "
            f"cache that small can sit nearer the cores than that read did, so for them the "
            f"roofline is no floor at all. The fastest of them, "
            f"{attention_kind(heads, fastest['K'])} at S = {fastest['S']} "
            f"({fastest['cache_bytes'] / MiB:.0f} MiB), ran at {share(fastest):.2f} times "
            f"the main-memory roofline's speed."
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


def beside_clause(figures: dict) -> str:
    """How MHA's read at the longest cache stands against the roofline's read
    (`decode_figures`' "mha_gbs", and "roof_gbs_beside", the ceiling the steps are held to)."""
    if figures["mha_gbs"] <= figures["roof_gbs_beside"]:
        return "a shared machine's bandwidth of the moment is often well below it."
    return (
        "MHA's step read faster than that read did, which the floor below accounts for: the "
        "two are not timed alike."
    )


def call_cost(single_seconds: float, per_step_seconds: float, steps: int) -> float:
    """What one call costs beyond its work (starting the program, waiting for its result),
    from one step timed both ways: as a call of its own (`single_seconds`) and per step of
    calls of `steps` steps (`per_step_seconds`, which carries 1/steps of that cost). Never
    below 0: a call of its own that ran faster than a step of the loop shows no such cost."""
    if steps < 2:
        raise ValueError(f"need calls of at least 2 steps to tell a call's cost, got {steps}")
    return max(0.0, (single_seconds - per_step_seconds) * steps / (steps - 1))


def timed_alike(
    decode: list[dict],
    layout_rows: list[dict],
    roofline,
    *,
    llc: int | None,
    length: int,
    heads: int,
    steps: int,
) -> dict:
    """The floor with the step and the roofline's read timed alike.

    Each sample of the roofline's read is one call; the sweep (`decode`, each row with its
    "predicted" seconds from `roofline`) times calls of `steps` steps. `decode_layout_control`'s
    `decode_attention` on the heads-major cache (`layout_rows`) is the sweep's MHA step at
    S = `length` (K = `heads`) timed one call at a time, as the read is: it is held to the
    floor as `floor_figures` holds a step ("alike_floor", with its margin). The sweep's steps
    are held to the floor with the read's time less the call's cost that the same step,
    timed both ways, shows (`call_cost`): "call_explains" is how much faster that makes the
    read (infinite where the cost is as long as the read itself, which then bounds nothing).
    """
    at = {(r["K"], r["S"]): r for r in decode}
    if (heads, length) not in at:
        raise ValueError(f"the sweep has no MHA row (K = {heads}) at S = {length}")
    step = at[heads, length]
    single = {(r["function"], r["layout"]): r for r in layout_rows}["decode_attention", HEADS_MAJOR]
    alike = floor_figures([dict(step, seconds=single["seconds"])], llc, length, heads)
    sweep = floor_figures(decode, llc, length, heads)
    cost = call_cost(single["seconds"], step["seconds"], steps)
    read = roofline.read_bytes / roofline.bytes_per_s  # the best read's seconds, one call
    left = read - cost
    return {
        "alike_ms": float(single["seconds"] * 1e3),
        "alike_step_ms": float(step["seconds"] * 1e3),
        "alike_steps": steps,
        "call_ms": float(cost * 1e3),
        "alike_floor": float(alike["floor_worst"]),
        "alike_margin": float(alike["floor_margin"]),
        "sweep_floor": float(sweep["floor_worst"]),
        "sweep_margin": float(sweep["floor_margin"]),
        "call_explains": float(read / left) if left > 0 else math.inf,
        "read_gbs_alike": float(roofline.read_bytes / left / 1e9) if left > 0 else math.inf,
    }


def floor_claims(figures: dict) -> dict[str, bool]:
    """What the page claims of `timed_alike`'s figures, on every backend: timed alike, one
    call each, the MHA step does not beat its floor by more than its margin; and no step of
    the sweep beats the floor by more than its margin and the call's cost together explain."""
    f = figures
    bound = (1 + f["sweep_margin"]) * f["call_explains"]
    return {
        f"timed alike with the roofline's read, one call each, MHA's step ran at "
        f"{f['alike_floor']:.3f} of its floor's speed, at most 1 + {f['alike_margin']:.2f}": (
            f["alike_floor"] <= 1 + f["alike_margin"]
        ),
        f"the sweep's fastest step ran at {f['sweep_floor']:.3f} of its floor's speed, at most "
        f"{bound:.3f}: 1 + {f['sweep_margin']:.2f}, times the {f['call_explains']:.3f} that "
        f"a call's cost of {f['call_ms']:.3f} ms explains": f["sweep_floor"] <= bound,
    }


def floor_sentence(figures: dict) -> str:
    """The page's sentences (Markdown) on the floor timed alike (`timed_alike`)."""
    f = figures
    text = (
        f"As a call of its own the step took {f['alike_ms']:.2f} ms, against "
        f"{f['alike_step_ms']:.2f} ms per step in the sweep's calls of {f['alike_steps']}. "
        f"Timed alike with the read, it ran at {f['alike_floor']:.2f} of the floor's speed "
        f"(the page fails above 1 + {f['alike_margin']:.0%})."
    )
    if f["sweep_floor"] <= 1 + f["sweep_margin"]:
        return text + " No step of the sweep beat the floor by more than that margin either."
    return text + (
        f" The sweep's fastest step, at {f['sweep_floor']:.2f} of the floor's speed, beat it "
        f"by what a call costs here: a step called on its own took {f['call_ms']:.2f} ms more "
        f"than its share of a call of {f['alike_steps']}, and without those "
        f"{f['call_ms']:.2f} ms the roofline's read runs at {f['read_gbs_alike']:.0f} GB/s, "
        f"{f['sweep_floor'] / f['call_explains']:.2f} of which that step reached (the page "
        f"fails where a step beats the floor by more than the margin and that cost explain)."
    )


def layout_figures(layout_rows: list[dict]) -> dict:
    """`decode_layout_control`'s four calls split apart: the layout alone (with its paired
    rounds' least and most), the function alone, and both at once, each against
    `decode_attention` on the heads-major cache; and each program's whole-cache transposes."""
    cell = {(r["function"], r["layout"]): r for r in layout_rows}
    base = cell["decode_attention", HEADS_MAJOR]
    alone, low, high = paired_spread(cell["decode_attention", SWAPPED]["samples"], base["samples"])
    return {
        "layout_alone": alone,
        "layout_alone_low": low,
        "layout_alone_high": high,
        "function_alone": paired_ratio(cell["attention", HEADS_MAJOR]["samples"], base["samples"]),
        "general_ratio": paired_ratio(cell["attention", SWAPPED]["samples"], base["samples"]),
        "heads_major_ms": float(base["seconds"] * 1e3),
        "general_ms": float(cell["attention", SWAPPED]["seconds"] * 1e3),
        "general_transposes": cell["attention", SWAPPED]["transposes"],
        "general_hm_transposes": cell["attention", HEADS_MAJOR]["transposes"],
        "base_transposes": base["transposes"],
        "swapped_transposes": cell["decode_attention", SWAPPED]["transposes"],
    }


def layout_margin(figures: dict) -> float:
    """How far from 1 `decode_attention`'s time on the (B, S, K, H) cache over its time on
    its own may sit and still be the same time: the larger of `CEILING_MARGIN` and the spread
    of the paired rounds ((most - least) / median, as `Roofline.spread`)."""
    f = figures
    return max(CEILING_MARGIN, (f["layout_alone_high"] - f["layout_alone_low"]) / f["layout_alone"])


def layout_claims(figures: dict) -> dict[str, bool]:
    """What the page claims of `layout_figures`, on every backend: `decode_attention`'s
    program transposes no cache stored in its own (B, K, S, H) layout; and the (B, S, K, H)
    layout costs it time where, and because, its compiled program transposes that cache: at
    least `TRANSPOSED_SLOWDOWN` times the step with a whole-cache transpose, the same time
    within `layout_margin` with none."""
    f = figures
    base, swapped, ratio = f["base_transposes"], f["swapped_transposes"], f["layout_alone"]
    claims = {
        f"decode_attention's program transposes no cache stored (B, K, S, H): {base}": base == 0
    }
    if swapped >= 1:
        claims[
            f"its program transposes the (B, S, K, H) cache ({swapped} whole-cache transposes), "
            f"so that layout makes the step at least {TRANSPOSED_SLOWDOWN} times slower: "
            f"{ratio:.2f}"
        ] = ratio >= TRANSPOSED_SLOWDOWN
    else:
        margin = layout_margin(f)
        claims[
            f"its program reads the (B, S, K, H) cache without a transpose, so both layouts "
            f"take the same time: {ratio:.3f} within 1 +- {margin:.3f} (rounds "
            f"{f['layout_alone_low']:.3f} to {f['layout_alone_high']:.3f})"
        ] = 1 / (1 + margin) <= ratio <= 1 + margin
    return claims


def layout_sentences(figures: dict) -> dict[str, str]:
    """The page's sentences (Markdown) on the layout alone, from its program's transposes:
    "layout_alone_text" (what the (B, S, K, H) layout cost `decode_attention`, and why),
    "layout_choice" (why the package's cache is heads-major, in that light) and
    "layout_takeaway" (the same, in the page's summary)."""
    f = figures
    if f["swapped_transposes"] >= 1:
        return {
            "layout_alone_text": (
                f"the (B, S, K, H) layout alone makes `decode_attention` "
                f"{f['layout_alone']:.1f} times slower, the {f['swapped_transposes']} "
                f"transposes of the whole cache in its program reading and writing it before "
                f"the step starts"
            ),
            "layout_choice": (
                "A cache layout is chosen once, for the step that reads it every token; the "
                "layout-alone row is why the package's one cache is heads-major."
            ),
            "layout_takeaway": (
                f"the general (B, S, K, H) layout pays a transpose of the whole cache every "
                f"step where the compiled program makes one ({f['layout_alone']:.1f} times "
                f"slower here, the function held fixed)"
            ),
        }
    return {
        "layout_alone_text": (
            f"the (B, S, K, H) layout alone leaves `decode_attention` at "
            f"{f['layout_alone']:.2f} times its time (its rounds ran from "
            f"{f['layout_alone_low']:.2f} to {f['layout_alone_high']:.2f}): its compiled "
            f"program reads that layout without a whole-cache transpose"
        ),
        "layout_choice": (
            "A cache layout is chosen once, for the step that reads it every token. Here the "
            "other layout cost `decode_attention` nothing, its program holding no transpose "
            "of it; where a compiler does transpose it, the page requires that to cost at "
            f"least {TRANSPOSED_SLOWDOWN} times the step, and the heads-major cache, which "
            "`decode_attention` reads without a transpose (checked on every build), never "
            "pays it. That is why the package's one cache is heads-major."
        ),
        "layout_takeaway": (
            f"the general (B, S, K, H) layout pays a transpose of the whole cache every step "
            f"where the compiled program makes one (here it made none, and took "
            f"{f['layout_alone']:.2f} times the time, the function held fixed)"
        ),
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


def kv_grouping(heads: int, kv_choices):
    """N query heads (top) joined to the K key/value head (bottom) each reads, per K."""
    from matplotlib.patches import Rectangle

    fig, axes = subplots(1, len(kv_choices), figsize=(11, 2.6))
    for ax, kv_heads in zip(axes, kv_choices):
        group = heads // kv_heads
        for n in range(heads):
            ax.add_patch(Rectangle((n, 1.6), 0.85, 0.6, color=f"C{n // group}", alpha=0.85))
            ax.text(n + 0.42, 1.9, f"{n}", ha="center", va="center", fontsize=6, color="white")
        for k in range(kv_heads):
            left = k * group + (group - 0.85) / 2  # the K/V head sits under its group's middle
            ax.add_patch(Rectangle((left, 0), 0.85, 0.6, color=f"C{k}"))
            ax.text(left + 0.42, 0.3, f"kv{k}", ha="center", va="center", fontsize=7, color="white")
            for n in range(k * group, (k + 1) * group):
                ax.plot([n + 0.42, left + 0.42], [1.6, 0.6], color=f"C{k}", linewidth=0.8)
        ax.set(
            xlim=(-0.3, heads + 0.2),
            ylim=(-0.3, 2.5),
            title=f"{attention_kind(heads, kv_heads)}: K = {kv_heads}, G = {group}",
        )
        ax.axis("off")
    fig.suptitle("N query heads (top) read K key/value heads (bottom): head n reads n // G", y=1.02)
    return fig


def cache_layout(batch: int = 2, kv_heads: int = 2, length: int = 6, group: int = 4):
    """One layer's keys in memory, (B, K, S, H) row-major, one cell per slot."""
    from matplotlib.patches import Rectangle

    fig, ax = subplots(figsize=(11, 2.4))
    x = 0
    for b in range(batch):
        for k in range(kv_heads):
            for s in range(length):
                ax.add_patch(Rectangle((x, 0), 0.95, 1, color=f"C{k}", alpha=0.35 + 0.1 * s))
                ax.text(x + 0.47, 0.5, f"s{s}", ha="center", va="center", fontsize=7)
                x += 1
            ax.annotate(
                "",
                xy=(x - length, 1.15),
                xytext=(x, 1.15),
                arrowprops=dict(arrowstyle="<->", color="black", linewidth=0.8),
            )
            ax.text(
                x - length / 2,
                1.35,
                f"b{b}, kv head {k}: S × H contiguous",
                ha="center",
                fontsize=8,
            )
            ax.text(
                x - length / 2,
                -0.45,
                f"read once for q{k * group}..q{(k + 1) * group - 1}",
                ha="center",
                fontsize=8,
                color=f"C{k}",
            )
            x += 0.4
    ax.set(xlim=(-0.2, x), ylim=(-0.8, 1.7))
    ax.axis("off")
    ax.set_title(
        "One layer's keys in memory, (B, K, S, H) row-major: each cell is one slot's "
        "H numbers; values are laid out the same way",
        fontsize=9,
    )
    return fig


def decode_times(decode: list[dict], kv_choices, *, batch: int, heads: int, head_dim: int):
    """Measured and predicted step time against S, and their ratio, one line per K."""
    fig, (time_ax, ratio_ax) = subplots(1, 2, figsize=(11, 4))
    for i, kv_heads in enumerate(kv_choices):
        mine = [r for r in decode if r["K"] == kv_heads]
        label = f"{attention_kind(heads, kv_heads)} (K = {kv_heads})"
        lengths = [r["S"] for r in mine]
        time_ax.loglog(
            lengths, [r["seconds"] * 1e3 for r in mine], "o-", color=f"C{i}", label=label
        )
        time_ax.loglog(lengths, [r["predicted"] * 1e3 for r in mine], ":", color=f"C{i}")
        ratio_ax.semilogx(
            lengths, [r["seconds"] / r["predicted"] for r in mine], "o-", color=f"C{i}", label=label
        )
    log2_axes(time_ax, ratio_ax)
    for ax in (time_ax, ratio_ax):
        ax.set_xlabel("cached tokens S")
        ax.legend(fontsize=8)
    time_ax.set(
        ylabel="decode step (ms)",
        title=f"measured (solid) and roofline (dotted); B = {batch}, N = {heads}, H = {head_dim}",
    )
    ratio_ax.axhline(1, color="gray", linewidth=0.8)
    ratio_ax.set(ylabel="measured / predicted", title="How far each kind is from its roofline")
    fig.tight_layout()
    return fig


def layer_decode_table(rows: list[dict], heads: int) -> list[dict]:
    """The whole layer's decode steps (`measure.layer_decode.layer_decode_sweep`, each row
    with its "predicted" seconds) as the page's table: weights and cache, against the roofline."""
    return [
        {
            "S": r["S"],
            "kind": attention_kind(heads, r["K"]),
            "weights MiB": r["weight_bytes"] / MiB,
            "cache MiB": r["cache_bytes"] / MiB,
            "weights' share of bytes": r["weight_bytes"] / r["bytes"],
            "predicted ms": r["predicted"] * 1e3,
            "measured ms": r["seconds"] * 1e3,
            "measured / predicted": r["seconds"] / r["predicted"],
        }
        for r in rows
    ]


def layer_decode_figures(rows: list[dict], kv_choices) -> dict:
    """MHA's time over MQA's (`kv_choices`: MHA, GQA, MQA) at the shortest and the longest
    cache: predicted (bytes), measured (the median of the paired rounds' ratios) and the
    rounds' least and most; GQA's at the longest as a share of its roofline. Chapter 10's
    claim is that MQA's lead grows with S (`lead_grows`)."""
    at = {(r["K"], r["S"]): r for r in rows}
    lengths = sorted({r["S"] for r in rows})
    if len(lengths) < 2 or any((k, s) not in at for k in kv_choices for s in lengths):
        raise ValueError(f"need every K of {list(kv_choices)} at two lengths or more: {sorted(at)}")
    mha, gqa, mqa = kv_choices
    figures = {"short": lengths[0], "long": lengths[-1]}
    for name, S in (("short", lengths[0]), ("long", lengths[-1])):
        slow, fast = at[mha, S], at[mqa, S]
        lead, low, high = paired_spread(slow["round_seconds"], fast["round_seconds"])
        figures |= {f"{name}_lead": lead, f"{name}_lead_low": low, f"{name}_lead_high": high}
        figures[f"{name}_lead_predicted"] = slow["bytes"] / fast["bytes"]
        figures[f"{name}_mqa_weight_share"] = fast["weight_bytes"] / fast["bytes"]
    long_gqa = at[gqa, lengths[-1]]
    figures["gqa_of_roofline"] = long_gqa["predicted"] / long_gqa["seconds"]
    figures["gqa_gbs"] = long_gqa["bytes"] / long_gqa["seconds"] / 1e9
    return figures


# How much higher the longest cache's median lead must be than the shortest's.
LEAD_MARGIN = 0.1


def lead_grows(figures: dict) -> bool:
    """Chapter 10's claim for the whole layer: MHA's time over MQA's grows from the shortest
    cache, where the weights, which every kind reads alike, are more of the bytes, to the
    longest: the median of the paired rounds by more than LEAD_MARGIN, and the lowest round
    too. (A median above every round's at the shortest failed one build in several on a
    2-core machine, where one round of the shortest ran far above its median.)"""
    return (
        figures["long_lead"] > (1 + LEAD_MARGIN) * figures["short_lead"]
        and figures["long_lead_low"] > figures["short_lead_low"]
    )
