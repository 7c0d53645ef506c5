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
    the bound exactly where the scaled loss keeps its gradients. `lost`: the share of the
    parameters' float16 gradients at the run's first scale that are zero where float32's are
    not, measured in the same program as the training's gradients; the claim reads at most
    the bound's share lost as kept (the CPU: 0.1 %). The probes of float16's subnormals
    (`subnormals`: made, read, through a matmul) are stated beside it, not claimed: on the
    TPU v5e (2026-12-07) the chip kept the one made, and the scaled run still stalled (0.367
    against a bound of 0.0156), so what a backend does with one value made in isolation does
    not decide where a whole backward pass loses its gradients."""
    scaled, alone = gaps["scaled"], gaps["alone"]
    probes = ", ".join(f"{name} {held}" for name, held in subnormals.items())
    return {
        f"float16 alone lies outside the bound: {alone:.4f} > {bound:.4f}": alone > bound,
        f"loss scaling narrows float16's gap: {scaled:.4f} < {alone:.4f}": scaled < alone,
        f"the scaled run is inside the bound ({scaled:.4f} <= {bound:.4f}) exactly where its "
        f"float16 gradients are kept ({lost:.1%} zero at the first scale where float32's are "
        f"not; kept means at most {bound:.1%}; subnormal probes: {probes})": (
            (scaled <= bound) == (lost <= bound)
        ),
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
    """What the scaled float16 run did against float32, as the page's sentence, from what it
    measured: inside or outside the bound, the share of gradients `lost` (as in
    `loss_scaling_claims`), and which probes kept a float16 subnormal (`subnormals`).
    `below`: the share of the parameters' nonzero float32 gradients of W x loss that, at
    the run's starting scale, lie below float16's smallest normal number; `start`: that
    starting scale, a power of two."""
    scaled, alone, bound_pc = 100 * gaps["scaled"], 100 * gaps["alone"], 100 * bound
    at = power_of_two(math.log2(start))
    zero = (
        f"{100 * lost:.1f} % of the parameters' float16 gradients at {at} are zero where "
        "float32's are not"
    )
    flushed = " and ".join(SUBNORMAL_PROBES[k] for k, held in subnormals.items() if not held)
    probes = (
        f"This backend flushes float16's subnormals to zero: {flushed}, computed as 0"
        if flushed
        else "This backend kept float16's subnormals in each probe (one made, one read, one "
        "through a matmul)"
    )
    if gaps["scaled"] <= bound:
        return (
            f"Started at {at}, with the same growth interval, the float16 run's loss stays "
            f"within {scaled:.2f} % of float32's at every epoch (the bound is 16 float16 "
            f"roundings, {bound_pc:.1f} %; float16 alone is {alone:.1f} % away at its worst). "
            f"{probes}, and {zero}."
        )
    return (
        f"Started at {at}, the float16 run's loss ends up {scaled:.1f} % from float32's at "
        f"its worst epoch. That is outside the bound of 16 float16 roundings ({bound_pc:.1f} "
        f"%), though closer than float16 alone ({alone:.1f} %): {zero}. Scaled by {at}, "
        f"{100 * below:.0f} % of the parameters' gradients of W × loss still lie below "
        f"float16's smallest normal number. {probes}"
        + (
            "."
            if flushed
            else ", so the backward pass loses them elsewhere; this page does not measure where."
        )
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
