"""Rendering for the pages: rows of measurements as Markdown tables, a pytree, a scan, a
sweep or a trace's spans as a figure."""

import jax
import numpy as np

from jaxloops.measure.profile import HOST_WORK, ROWS, Span


def subplots(*args, **kwargs):
    """`matplotlib.pyplot.subplots`, with pyplot imported at the first figure: importing it
    takes about 0.4 s, which each process that imports `measure` only to time something (a
    test worker, a fresh process a test or a chapter starts) would otherwise pay."""
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def markdown_table(rows, columns: dict) -> str:
    """Rows of a sweep as a Markdown table.

    Args:
      rows: dicts, e.g. from a sweep above.
      columns: {row key: header}; floats are shown with 3 significant digits, None as "—".
    """

    def cell(value):
        if value is None or value == "":
            return "—"
        if isinstance(value, float):
            return f"{value:.3g}"
        return str(value).replace("|", "\\|").replace("$", "\\$")

    lines = ["| " + " | ".join(columns.values()) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(key)) for key in columns) + " |" for row in rows]
    return "\n".join(lines)


def draw_tree(ax, tree, title: str, colour: str) -> None:
    """One box per leaf of `tree` on the matplotlib axes `ax`: its path, shape and mean |value|."""
    rows = [
        ("/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path), leaf)
        for path, leaf in jax.tree.leaves_with_path(tree)
    ]
    for i, (name, leaf) in enumerate(rows):
        mean = float(np.abs(np.asarray(leaf)).mean())
        ax.text(
            0.02, 1 - (i + 0.5) / len(rows), f"{name}  {tuple(leaf.shape)}   |{mean:.1e}| mean",
            va="center", fontsize=9, family="monospace",
            bbox={"boxstyle": "round", "fc": colour, "alpha": 0.2},
        )  # fmt: skip
    ax.set_title(title, fontsize=10)
    ax.axis("off")


def draw_params(ax, params: dict) -> None:
    """The MLP's parameter pytree on `ax`: the dict, its layers, and each layer's w and b."""
    box = lambda colour: {"boxstyle": "round", "fc": colour, "alpha": 0.2}
    arrow = {"arrowstyle": "->"}
    ax.text(0.02, 0.5, "params\n(dict)", ha="center", va="center", fontsize=10, bbox=box("C0"))
    layers = sorted(params)
    for i, layer in enumerate(layers):
        y_layer = 1 - (i + 0.5) / len(layers)
        ax.annotate("", (0.3, y_layer), (0.08, 0.5), arrowprops=arrow)
        ax.text(0.35, y_layer, f'"{layer}"', ha="center", va="center", fontsize=10, bbox=box("C1"))
        for j, name in enumerate(("w", "b")):
            y_leaf = y_layer + (0.12 if j == 0 else -0.12) / max(1, len(layers) / 3)
            shape = tuple(params[layer][name].shape)
            ax.annotate("", (0.62, y_leaf), (0.42, y_layer), arrowprops=arrow)
            ax.text(0.64, y_leaf, f'"{name}": array {shape}', va="center", fontsize=9,
                    bbox=box("C2"))  # fmt: skip
    ax.set(xlim=(-0.05, 1.0), ylim=(-0.05, 1.05))
    ax.set_title("the parameter pytree: dicts are nodes, arrays are leaves")
    ax.axis("off")


def draw_scan(ax, steps: int = 4) -> None:
    """`lax.scan` over `steps` steps on `ax`: batches in, metrics out, the carry passed on."""
    from matplotlib.patches import Rectangle

    arrow = lambda colour="black": {"arrowstyle": "->", "color": colour}
    for t in range(steps):
        x = 2.2 * t
        ax.add_patch(Rectangle((x + 0.4, 0.6), 1.2, 0.8, color="C0", alpha=0.25))
        ax.text(x + 1.0, 1.0, "train_step", ha="center", va="center", fontsize=9)
        ax.annotate("", (x + 1.0, 1.4), (x + 1.0, 2.0), arrowprops=arrow())
        ax.text(x + 1.0, 2.1, f"batches[{t}]", ha="center", fontsize=8)
        ax.annotate("", (x + 1.0, -0.1), (x + 1.0, 0.6), arrowprops=arrow())
        ax.text(x + 1.0, -0.35, f"metrics[{t}]", ha="center", fontsize=8)
        end = x + 2.6 if t < steps - 1 else x + 2.4
        ax.annotate("", (end, 1.0), (x + 1.6, 1.0), arrowprops=arrow("C3"))
    carry = "carry\n(params,\nopt_state)"
    ax.text(-0.1, 1.0, carry, ha="right", va="center", fontsize=8, color="C3")
    ax.annotate("", (0.4, 1.0), (0.0, 1.0), arrowprops=arrow("C3"))
    ax.text(2.2 * steps + 0.2, 1.0, "final\ncarry", ha="left", va="center", fontsize=8, color="C3")
    ax.set(xlim=(-1.4, 2.2 * steps + 1.2), ylim=(-0.6, 2.4))
    ax.set_title("lax.scan: one program, the carry passed from step to step")
    ax.axis("off")


def draw_throughput(left, right, sweeps: dict, ceiling: float) -> None:
    """Examples/s (`left`) and % of the matmul `ceiling` (`right`) against batch size, one
    line per sweep of `{label: rows with batch_size, examples_per_s, flops_per_s}`."""
    highest = 100.0
    for label, sweep in sweeps.items():
        batch = [r["batch_size"] for r in sweep]
        percent = [100 * r["flops_per_s"] / ceiling for r in sweep]
        left.plot(batch, [r["examples_per_s"] for r in sweep], marker="o", label=label)
        right.plot(batch, percent, marker="o", label=label)
        highest = max(highest, *percent)
    left.set(xscale="log", yscale="log", xlabel="batch size", ylabel="examples per second")
    left.set_title("throughput of the scanned epoch")
    left.legend()
    right.axhline(100, color="gray", linestyle="--", label="f32 matmul ceiling")
    right.set(xscale="log", xlabel="batch size", ylabel="% of matmul ceiling")
    right.set(ylim=(0, 1.1 * highest), title="fraction of the machine's ceiling")
    right.legend(loc="lower right", fontsize=8)
    for axis in (left, right):
        axis.set_xticks(batch, [str(b) for b in batch])
        axis.minorticks_off()


def draw_timeline(ax, spans: list[Span], title: str) -> None:
    """One horizontal bar per span, one row per kind, on a matplotlib axis (milliseconds)."""
    colours = {HOST_WORK: "C1", "dispatch": "C0", "wait": "C3", "device": "C2"}
    for y, row in enumerate(ROWS):
        bars = [(1e3 * s.start, 1e3 * (s.end - s.start)) for s in spans if s.row == row]
        ax.broken_barh(bars, (y - 0.35, 0.7), color=colours[row])
    ax.set_yticks(range(len(ROWS)), ROWS)
    ax.invert_yaxis()
    ax.set_title(title, fontsize=9, loc="left")
