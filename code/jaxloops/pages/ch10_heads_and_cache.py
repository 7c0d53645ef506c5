"""Chapter 10's page: head grouping and the cache's layout drawn, the decode sweep's figures,
tables and plots, and what serving a large model would keep (book/10_heads_and_cache.md)."""

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


def layout_figures(layout_rows: list[dict]) -> dict:
    """`decode_layout_control`'s four calls split apart: the layout alone, the function
    alone, and both at once, each against `decode_attention` on the heads-major cache."""
    cell = {(r["function"], r["layout"]): r for r in layout_rows}
    heads_major, swapped = "(B, K, S, H)", "(B, S, K, H)"
    base = cell["decode_attention", heads_major]
    return {
        "layout_alone": paired_ratio(cell["decode_attention", swapped]["samples"], base["samples"]),
        "function_alone": paired_ratio(cell["attention", heads_major]["samples"], base["samples"]),
        "general_ratio": paired_ratio(cell["attention", swapped]["samples"], base["samples"]),
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


def lead_grows(figures: dict) -> bool:
    """Chapter 10's claim for the whole layer: MHA's time over MQA's at the longest cache
    (the median of its rounds) is above every round's at the shortest, where the weights,
    which every kind reads alike, are more of the bytes. The margin is the shortest cache's
    own spread."""
    return figures["long_lead"] > figures["short_lead_high"]
