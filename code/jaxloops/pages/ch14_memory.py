"""Chapter 14's page: its figures, drawn from the rows of `jaxloops.measure.step_memory`
(book/14_memory.md)."""

import math

from jaxloops.memory import step_bytes
from jaxloops.pages.common import MiB
from jaxloops.pages.render import subplots

# The least and the most compiled scratch over the formula (`formula_sweep`, accumulation's
# rows) that chapter 14 accepts. The formula counts every residual in float32, in the
# device's memory, none recomputed: XLA:CPU kept 1.38x to 1.54x of it (2026-12-06); compiled
# for a TPU v5e (ahead of time, at the TPU's sizes), XLA kept 0.56x at B 32, T 256 (1.01x at
# T 64; accumulation 0.58x at M 4), some residuals in a core's VMEM, matmul inputs in
# bfloat16 at the default precision.
FORMULA_BAND = (0.5, 2.5)


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


def fit_table(rows) -> list[dict]:
    """The biggest-model rows (`measure.largest_fit.largest_fit_table`) as the page shows
    them: per technique, the formula's and the compiled largest L and B, compiled over
    formula (measured over predicted), the held bytes at each answer over the budget, and
    the compiles the two searches made."""
    shown = []
    for r in rows:
        row = {"technique": r["technique"]}
        for axis in ("L", "B"):
            formula, compiled = r[f"formula {axis}"], r[f"compiled {axis}"]
            row[f"formula {axis}"] = formula
            row[f"compiled {axis}"] = compiled
            row[f"compiled / formula {axis}"] = compiled / formula if formula else None
            row[f"held / budget at {axis}"] = r[f"held / budget at {axis}"]
        row["compiles"] = r["compiles for L"] + r["compiles for B"]
        shown.append(row)
    return shown


def search_failures(rows) -> dict:
    """{"technique, axis": problems} for every search whose probes contradict its answer
    (`largest_fit.search_problems`): empty when each answer fits and the next size does not."""
    return {
        f"{r['technique']}, {axis}": r[f"problems at {axis}"]
        for r in rows
        for axis in ("L", "B")
        if r[f"problems at {axis}"]
    }


def ratio_range(rows, axis: str) -> tuple[float, float]:
    """The least and the greatest compiled / formula answer along `axis` over the rows of
    `fit_table` (rows whose formula answer is 0 left out)."""
    ratios = [r[f"compiled / formula {axis}"] for r in rows if r[f"formula {axis}"]]
    return min(ratios), max(ratios)


def run_memory_sentence(run: dict, budget: int) -> str:
    """What the device reported about the run of `largest_fit.run_train_step`, as a
    sentence: its allocator's peak against the budget, or that the backend reports none."""
    before, after = run["before"], run["after"]
    if after is None or "peak_bytes_in_use" not in after:
        return (
            "This backend reports no allocator statistics (memory_stats() is None, as on a "
            "CPU), so the run's peak cannot be shown: what is shown is that it completed."
        )
    peak, earlier = after["peak_bytes_in_use"], (before or {}).get("peak_bytes_in_use", 0)
    in_use = (before or {}).get("bytes_in_use", 0)
    said = (
        f"The device's allocator reported a peak of {peak / MiB:,.0f} MiB in use after the "
        f"run, {peak / budget:.2f}× the budget, with {in_use / MiB:,.0f} MiB in use before it"
    )
    if peak > earlier:
        return said + ": the run set that peak."
    return said + f": the run did not raise the peak set earlier ({earlier / MiB:,.0f} MiB)."


def loss_scaling_claims(gaps: dict, bound: float, subnormals: dict, lost: float) -> dict[str, bool]:
    """Chapter 14's claims for float16 and loss scaling, from the curves' largest relative
    gaps to float32 (`gaps`: "scaled", "alone") and `bound` (16 float16 roundings): float16
    alone lies outside the bound; scaling narrows the gap; and the scaled run lies inside
    the bound exactly where the backend keeps float16's subnormals, each probe of
    `subnormals` (made, read, through a matmul): the gradients of W x loss live among them,
    and a backend that flushes them loses those gradients, scaled or not. `lost`: the share
    of the parameters' gradients that are zero at the run's first scale where float32's are
    not, stated beside it."""
    scaled, alone = gaps["scaled"], gaps["alone"]
    kept = all(subnormals.values())
    probes = ", ".join(f"{name} {held}" for name, held in subnormals.items())
    return {
        f"float16 alone lies outside the bound: {alone:.4f} > {bound:.4f}": alone > bound,
        f"loss scaling narrows float16's gap: {scaled:.4f} < {alone:.4f}": scaled < alone,
        f"the scaled run is inside the bound ({scaled:.4f} <= {bound:.4f}) exactly where "
        f"float16 keeps its subnormals ({probes}; {lost:.1%} of the gradients zero at the first "
        f"scale where float32's are not)": (scaled <= bound) == kept,
    }


def power_of_two(exponent: float) -> str:
    """2 to a whole `exponent` as the prose writes it: "2¹⁵", "2⁻¹⁴"; ValueError otherwise."""
    if exponent != round(exponent):
        raise ValueError(f"exponent must be a whole number, got {exponent}")
    return "2" + str(int(round(exponent))).translate(str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹"))


# What each probe of float16's subnormals computed, as the prose names it
SUBNORMAL_PROBES = {
    "made": "half of 2⁻¹⁴, float16's smallest normal number",
    "read": "2⁻¹⁵ read and doubled",
    "matmul": "2⁻¹⁵ passed through a matmul",
}


def loss_scaling_sentence(
    gaps: dict, bound: float, subnormals: dict, below: float, lost: float, start: float
) -> str:
    """What the scaled float16 run did against float32, as the page's sentence. `subnormals`:
    which probes kept a float16 subnormal; `below`: the share of the parameters' nonzero
    float32 gradients of W x loss that, at the run's starting scale, lie below float16's
    smallest normal number; `lost`: the share of float16's gradients there that are zero
    where float32's are not; `start`: that starting scale, a power of two."""
    scaled, alone, bound_pc = 100 * gaps["scaled"], 100 * gaps["alone"], 100 * bound
    at = power_of_two(math.log2(start))
    zero = (
        f"{100 * lost:.1f} % of the parameters' float16 gradients at {at} are zero where "
        "float32's are not"
    )
    if all(subnormals.values()):
        return (
            f"Started at {at}, with the same growth interval, the float16 run's loss stays "
            f"within {scaled:.2f} % of float32's at every epoch (the bound is 16 float16 "
            f"roundings, {bound_pc:.1f} %; float16 alone is {alone:.1f} % away at its worst). "
            f"This backend keeps float16's subnormals, and {zero}."
        )
    flushed = " and ".join(SUBNORMAL_PROBES[k] for k, held in subnormals.items() if not held)
    return (
        f"This backend flushes float16's subnormals to zero: {flushed}, computed as 0. Scaled "
        f"by {at}, {100 * below:.0f} % of the parameters' gradients of W × loss still lie below "
        f"float16's smallest normal number, and {zero}. Started at {at}, the float16 "
        f"run's loss ends up {scaled:.1f} % from float32's at its worst epoch. That is outside "
        f"the bound of 16 float16 roundings ({bound_pc:.1f} %), though closer than float16 "
        f"alone ({alone:.1f} %)."
    )


# The techniques the prose names, by the short name of their glued numbers.
FIT_NAMES = {
    "none": "none",
    "nothing": "remat, nothing saved",
    "names": "remat, names saved",
    "dots": "remat, dots saved",
    "bf16": "bfloat16 compute",
}


def fit_numbers(rows) -> dict:
    """The numbers the prose quotes from `largest_fit_table`'s rows: each named technique's
    compiled and formula answers ("fit_none_L", "fit_none_formula_L", ...), the range of
    compiled / formula per axis, and the searches: how many, their probes, and how many
    settled in two (the first prediction right)."""
    by = {r["technique"]: r for r in rows}
    numbers = {}
    for short, name in FIT_NAMES.items():
        for axis in ("L", "B"):
            numbers[f"fit_{short}_{axis}"] = by[name][f"compiled {axis}"]
            numbers[f"fit_{short}_formula_{axis}"] = by[name][f"formula {axis}"]
    shown = fit_table(rows)
    for axis in ("L", "B"):
        numbers[f"fit_{axis}_low"], numbers[f"fit_{axis}_high"] = ratio_range(shown, axis)
    counts = [r[f"compiles for {axis}"] for r in rows for axis in ("L", "B")]
    numbers.update(searches=len(counts), probes=sum(counts), right_first=counts.count(2))
    return numbers


def run_numbers(run: dict, row: dict, budget: int) -> dict:
    """The numbers the prose quotes from a run of `largest_fit.run_train_step` at the L of
    the table's `row`: its loss, its program's held MiB, those over the held bytes the search
    counted at that L, and `run_memory_sentence` (None for what the run did not reach)."""
    searched = row["held / budget at L"] and row["held / budget at L"] * budget
    held = run["step_held"]
    return {
        "run_loss": run["loss"],
        "run_held": held and held / MiB,
        "run_over_search": held / searched if held and searched else None,
        "run_memory": run_memory_sentence(run, budget),
    }
