"""Rendering for the pages: rows of measurements as Markdown tables, a pytree as a figure."""

import jax
import numpy as np


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
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
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
