"""Chapter 10's figures: head grouping, the cache's layout, and the decode sweep."""

import matplotlib.pyplot as plt
from matplotlib.ticker import ScalarFormatter

from jaxloops.kvcache import attention_kind


def kv_grouping(heads: int, kv_choices):
    """N query heads (top) joined to the K key/value head (bottom) each reads, per K."""
    fig, axes = plt.subplots(1, len(kv_choices), figsize=(11, 2.6))
    for ax, kv_heads in zip(axes, kv_choices):
        group = heads // kv_heads
        for n in range(heads):
            ax.add_patch(plt.Rectangle((n, 1.6), 0.85, 0.6, color=f"C{n // group}", alpha=0.85))
            ax.text(n + 0.42, 1.9, f"{n}", ha="center", va="center", fontsize=6, color="white")
        for k in range(kv_heads):
            left = k * group + (group - 0.85) / 2  # the K/V head sits under its group's middle
            ax.add_patch(plt.Rectangle((left, 0), 0.85, 0.6, color=f"C{k}"))
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
    fig, ax = plt.subplots(figsize=(11, 2.4))
    x = 0
    for b in range(batch):
        for k in range(kv_heads):
            for s in range(length):
                ax.add_patch(plt.Rectangle((x, 0), 0.95, 1, color=f"C{k}", alpha=0.35 + 0.1 * s))
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
    fig, (time_ax, ratio_ax) = plt.subplots(1, 2, figsize=(11, 4))
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
    for ax in (time_ax, ratio_ax):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())
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
