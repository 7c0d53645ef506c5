"""Chapters 8 and 10's figures: the online softmax's walk, attention's scratch, FLOPs and
latency against T; head grouping, the cache's layout, and the decode sweep."""

import numpy as np

from jaxloops.kvcache import attention_kind
from jaxloops.measure.render import subplots


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
    _log2_axes(time_ax, ratio_ax)
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


def _log2_axes(*axes) -> None:
    from matplotlib.ticker import ScalarFormatter

    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())


def online_walk(scores, walk, exact, block: int = 6):
    """The online softmax over one row of scores, `block` keys at a time: the running max,
    the running sum (in units of the final max) and the output o / l against the exact one.

    Args:
      walk: per block, (m, l, o) after it, each a 1-D array.
    """
    row, m_final = np.asarray(scores).ravel(), walk[-1][0][0]
    fig, (s_ax, l_ax, o_ax) = subplots(1, 3, figsize=(13, 3.6))
    for b in range(len(walk)):
        s_ax.axvspan(block * b - 0.5, block * b + block - 0.5, color=f"C{b}", alpha=0.08)
        s_ax.hlines(
            walk[b][0][0],
            -0.5,
            block * b + block - 0.5,
            color=f"C{b}",
            label=f"running max m after block {b + 1}",
        )
    s_ax.plot(range(len(row)), row, "k.", label="scores s of the row")
    s_ax.set(xlabel="key position s", ylabel="score", title="Running max: only grows")
    blocks = np.arange(1, len(walk) + 1)
    # l is relative to the running max: bring each to the final max to compare like with like.
    l_ax.bar(
        blocks,
        [w[1][0] * np.exp(w[0][0] - m_final) for w in walk],
        color=[f"C{b}" for b in range(len(walk))],
    )
    l_ax.axhline(
        np.exp(row - m_final).sum(), color="k", ls=":", label=f"sum over all {len(row)} keys"
    )
    l_ax.set(
        xlabel="blocks folded in",
        ylabel="l, in units of the final max",
        title="Running sum: rescaled, then added to",
    )
    for h in range(3):
        o_ax.plot(
            blocks,
            [w[2][h] / w[1][0] for w in walk],
            "o-",
            color=f"C{h}",
            label=f"o/l, component {h}",
        )
        o_ax.axhline(exact[h], color=f"C{h}", ls=":")
    o_ax.set(xlabel="blocks folded in", ylabel="output", title="Output o / l (dotted: exact)")
    for ax in (s_ax, l_ax, o_ax):
        ax.legend(fontsize=7)
    for ax in (l_ax, o_ax):
        ax.set_xticks(blocks)
    fig.tight_layout()
    return fig


def scratch_and_flops(rows: dict, lengths, names: dict, *, batch: int, heads: int, head_dim: int):
    """Compiled scratch and FLOPs against T = S, per implementation, beside one (B, N, T, S)
    float32 array and 4·B·N·T·S·H. `rows`: (implementation, T) -> sweep row."""
    fig, (mem_ax, flop_ax) = subplots(1, 2, figsize=(11, 4))
    # Where naive and XLA need the same scratch their lines coincide: XLA is drawn dashed with
    # open, larger markers so both stay visible, and the legend says where they overlap.
    same = [t for t in lengths if rows["naive", t]["temp_bytes"] == rows["xla", t]["temp_bytes"]]
    xla_note = (
        ""
        if not same
        else " (same as naive)"
        if same == list(lengths)
        else f" (same as naive from T = {min(same)})"
    )
    styles = {
        "naive": dict(marker="o", linestyle="-"),
        "xla": dict(marker="s", linestyle="--", markersize=9, markerfacecolor="none"),
        "blockwise": dict(marker="^", linestyle="-"),
    }
    for name in ("naive", "xla", "blockwise"):
        mem_ax.loglog(
            lengths,
            [rows[name, t]["temp_bytes"] / 2**20 for t in lengths],
            label=names[name] + (xla_note if name == "xla" else ""),
            **styles[name],
        )
    mem_ax.loglog(
        lengths,
        [batch * heads * t * t * 4 / 2**20 for t in lengths],
        "k:",
        label="one float32 (B, N, T, S) array",
    )
    mem_ax.set(
        xlabel="sequence length T = S (tokens)",
        ylabel="compiled scratch memory (MiB)",
        title="Temporary memory",
    )
    flop_ax.loglog(
        lengths, [rows["naive", t]["flops"] / 1e9 for t in lengths], "o-", label=names["naive"]
    )
    flop_ax.loglog(
        lengths,
        [4 * batch * heads * t * t * head_dim / 1e9 for t in lengths],
        "k:",
        label="4·B·N·T·S·H (the two matmuls)",
    )
    flop_ax.set(
        xlabel="sequence length T = S (tokens)",
        ylabel="GFLOP per call",
        title="FLOPs (XLA cost analysis)",
    )
    _log2_axes(mem_ax, flop_ax)
    for ax in (mem_ax, flop_ax):
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def latency(rows: dict, lengths, names: dict, predicted, title: str):
    """Median latency against T = S for each implementation that ran, and the roofline's
    prediction (`predicted(name, T)[0]`, seconds) for naive and blockwise."""
    fig, ax = subplots(figsize=(6.5, 4))
    for i, name in enumerate(("naive", "xla", "blockwise")):
        timed = [t for t in lengths if rows[name, t]["seconds"] is not None]
        ax.loglog(
            timed,
            [rows[name, t]["seconds"] * 1e3 for t in timed],
            "o-",
            color=f"C{i}",
            label=f"{names[name]}, measured",
        )
    for i, name in ((0, "naive"), (2, "blockwise")):
        timed = [t for t in lengths if rows[name, t]["seconds"] is not None]
        ax.loglog(
            timed,
            [predicted(name, t)[0] * 1e3 for t in timed],
            ":",
            color=f"C{i}",
            label=f"{name}, roofline prediction",
        )
    _log2_axes(ax)
    ax.set(xlabel="sequence length T = S (tokens)", ylabel="median latency (ms)", title=title)
    ax.legend(fontsize=7)
    return fig
