"""Chapter 14's page: its figures, drawn from the rows of `jaxloops.measure.step_memory`
(book/14_memory.md)."""

from jaxloops.memory import step_bytes
from jaxloops.pages.common import MiB
from jaxloops.pages.render import subplots


def _line(rows, axis, fixed):
    """The rows where every key of `fixed` has its value, sorted by `axis`."""
    chosen = [r for r in rows if all(r[k] == v for k, v in fixed.items())]
    return sorted(chosen, key=lambda r: r[axis])


def formula_against_compiled(rows, center: dict):
    """Three panels (B, T, L): the formula's line through the compiled and autodiff bytes,
    each panel varying one letter with the others at `center`."""
    fig, axes = subplots(1, 3, figsize=(10, 3.2))
    for ax, axis in zip(axes, ("B", "T", "L")):
        line = _line(rows, axis, {k: v for k, v in center.items() if k != axis})
        xs = [r[axis] for r in line]
        ax.plot(xs, [r["formula"] / MiB for r in line], "-", label="formula")
        ax.plot(xs, [r["compiled"] / MiB for r in line], "o", label="compiled temp")
        ax.plot(xs, [r["autodiff"] / MiB for r in line], "s", mfc="none", label="saved residuals")
        ax.set_xlabel(axis)
        ax.set_xticks(xs)
    axes[0].set_ylabel("MiB")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def remat_tradeoff(policy_rows):
    """Compiled scratch against recomputed GFLOPs, one point per remat policy."""
    fig, ax = subplots(figsize=(5.5, 3.2))
    for row in policy_rows:  # named in a legend: two policies' points may nearly coincide
        ax.plot(row["extra GFLOP per block"], row["temp MiB"], "o", label=row["policy"])
    ax.legend(title="remat policy")
    ax.set_xlabel("recomputed GFLOP per block (cost analysis)")
    ax.set_ylabel("compiled temp (MiB)")
    fig.tight_layout()
    return fig


def compile_against_layers(compile_rows):
    """HLO instructions and compile CPU seconds against L, unrolled and scanned."""
    fig, axes = subplots(1, 2, figsize=(9, 3.2))
    for kind in ("unrolled", "scanned"):
        line = _line(compile_rows, "L", {"kind": kind})
        for ax, key in zip(axes, ("instructions", "compile s")):
            ax.plot([r["L"] for r in line], [r[key] for r in line], "o-", label=kind)
            ax.set_xlabel("L")
            ax.set_ylabel(key if key == "instructions" else "compile (CPU s)")
    axes[0].legend()
    fig.tight_layout()
    return fig


def loss_curves(curves: dict):
    """Per-epoch training loss of each named run."""
    fig, ax = subplots(figsize=(6, 3.2))
    for name, curve in curves.items():
        ax.plot(range(1, len(curve) + 1), curve, "o-", label=name, ms=3)
    ax.set_xlabel("epoch")
    ax.set_ylabel("train loss (nats)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def fits_budget(config, length: int, budget: int):
    """`(B, M=1) -> bool`: whether M micro-batches of B examples each, at T = `length`, fit
    `budget` bytes by the chapter's formula (`memory.step_bytes`)."""

    def fits(batch: int, micro: int = 1) -> bool:
        return sum(step_bytes(config, batch * micro, length, micro=micro)) <= budget

    return fits
