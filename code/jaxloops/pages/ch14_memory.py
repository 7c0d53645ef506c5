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


def allocator_footprint(before: dict | None, after: dict | None) -> dict | None:
    """What the device's allocator says a run held, from `memory_stats()` taken `before` and
    `after` it (None where the backend reports none, as on a CPU).

    Arrays sit in `bytes_in_use`; a TPU keeps a compiled program's temporaries outside it, in
    memory it reserves (`bytes_reserved`, with its own peak), where a GPU's allocator counts
    them in use. The run's footprint is its arrays (in use after, less in use before) plus
    the reserve where the backend reports one and the run raised its peak; None where the
    run did not raise the peak it reads, which then belongs to something earlier.

    Returns:
      {"in_use_before", "peak_in_use", "reserved" (None where not reported), "footprint",
      "counters" (the names read)}, in bytes; None without statistics.
    """
    if after is None or "peak_bytes_in_use" not in after:
        return None
    before = before or {}
    peak, in_use = after["peak_bytes_in_use"], before.get("bytes_in_use", 0)
    arrays = after.get("bytes_in_use", peak) - in_use  # the run's own arrays, still alive
    if "bytes_reserved" in after or "peak_bytes_reserved" in after:
        reserved = after.get("peak_bytes_reserved", after.get("bytes_reserved"))
        earlier = before.get("peak_bytes_reserved", before.get("bytes_reserved", 0))
        counters = ("bytes_in_use", "peak_bytes_in_use", "peak_bytes_reserved")
        footprint = arrays + reserved if reserved > earlier else None
    else:  # temporaries counted in use: the run's peak, if it set one
        reserved, counters = None, ("bytes_in_use", "peak_bytes_in_use")
        raised = peak > before.get("peak_bytes_in_use", 0)
        footprint = peak - in_use if raised else None
    return {"in_use_before": in_use, "peak_in_use": peak, "reserved": reserved,
            "footprint": footprint, "counters": counters}  # fmt: skip


def run_memory_sentence(run: dict, budget: int) -> str:
    """What the device reported about the run of `largest_fit.run_train_step`, as a
    sentence: the run's footprint by `allocator_footprint` against the budget, naming the
    counters read, or that the backend reports none."""
    seen = allocator_footprint(run["before"], run["after"])
    if seen is None:
        return (
            "This backend reports no allocator statistics (memory_stats() is None, as on a "
            "CPU), so the run's peak cannot be shown: what is shown is that it completed."
        )
    said = (
        f"The device's allocator reported a peak of {seen['peak_in_use'] / MiB:,.0f} MiB of "
        f"arrays in use (peak_bytes_in_use; {seen['in_use_before'] / MiB:,.0f} MiB of them in "
        "use before the run)"
    )
    if seen["reserved"] is not None:
        said += (
            f" and {seen['reserved'] / MiB:,.0f} MiB reserved (peak_bytes_reserved), where "
            "this backend keeps a compiled program's temporaries, outside bytes_in_use"
        )
    if seen["footprint"] is None:
        return said + ": the run did not raise the peak it reads, so its own is not shown."
    parts = "its arrays and that reserve" if seen["reserved"] is not None else "its peak"
    return said + (
        f". The run's footprint, {parts}, is {seen['footprint'] / MiB:,.0f} MiB, "
        f"{seen['footprint'] / budget:.2f}× the budget."
    )


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
    the run's scale, lie below float16's smallest normal number; `start`: that scale, a
    power of two, at which the run is held."""
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
            f"Held at {at} (its growth interval longer than the run), the float16 run's loss stays "
            f"within {scaled:.2f} % of float32's at every epoch (the bound is 16 float16 "
            f"roundings, {bound_pc:.1f} %; float16 alone is {alone:.1f} % away at its worst). "
            f"{probes}, and {zero}."
        )
    return (
        f"Held at {at}, the float16 run's loss ends up {scaled:.1f} % from float32's at "
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


def scale_rows(hooks, skipped, start: float, steps_per_epoch: int) -> list[dict]:
    """A loss-scaled `fit` run's scale over its steps: {"step", "log2 scale", "skipped"} at
    its start and at the end of each epoch, from the hook's records (`History.hooks`:
    (epoch, {"scale": ...}) per epoch) and the per-epoch means of the step's "skipped" metric
    (`skipped`), counted up to that step."""
    if len(hooks) != len(skipped):
        raise ValueError(f"{len(hooks)} hook records for {len(skipped)} epochs of metrics")
    rows, so_far = [{"step": 0, "log2 scale": math.log2(start), "skipped": 0}], 0
    for (epoch, seen), mean in zip(hooks, skipped):
        so_far += int(round(float(mean) * steps_per_epoch))
        rows.append({"step": epoch * steps_per_epoch, "log2 scale": math.log2(seen["scale"]),
                     "skipped": so_far})  # fmt: skip
    return rows


def scale_plot(runs: dict):
    """Two panels over the steps, one line per run (`runs`: name -> `scale_rows`): the loss
    scale (log2) and the steps skipped so far."""
    fig, axes = subplots(1, 2, figsize=(9, 3.2))
    for name, rows in runs.items():
        steps = [r["step"] for r in rows]
        axes[0].plot(steps, [r["log2 scale"] for r in rows], "o-", ms=3, label=name)
        axes[1].plot(steps, [r["skipped"] for r in rows], "o-", ms=3, label=name)
    axes[0].set_ylabel("log2 of the loss scale")
    axes[1].set_ylabel("steps skipped so far")
    for ax in axes:
        ax.set_xlabel("step")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def growing_scale_sentence(
    gaps: dict, bound: float, start: float, final: float, skipped: int
) -> str:
    """What the run with a float32 loss and a growing scale did, as the page's sentence: the
    scale from `start` to `final` (powers of two), the steps `skipped`, and its loss against
    float32's (`gaps`: "worst" and "last" epoch, relative) inside or outside `bound`."""
    if final <= start:
        raise ValueError(f"the scale did not rise: from {start} to {final}")
    moved = (
        f"From {power_of_two(math.log2(start))} the scale rose to "
        f"{power_of_two(math.log2(final))} by the last step, with {skipped} "
        f"step{'s' * (skipped != 1)} skipped"
    )
    worst, last, bound_pc = 100 * gaps["worst"], 100 * gaps["last"], 100 * bound
    if gaps["worst"] <= bound:
        return (
            f"{moved}, and the run's loss stays within {worst:.2f} % of float32's at every "
            f"epoch, inside the bound of 16 float16 roundings ({bound_pc:.1f} %)."
        )
    return (
        f"{moved}; the run's loss ends {last:.1f} % from float32's and is {worst:.1f} % away "
        f"at its worst epoch, outside the bound of 16 float16 roundings ({bound_pc:.1f} %)."
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
    counted at that L, the allocator's footprint (`allocator_footprint`) in MiB and over the
    held bytes, and `run_memory_sentence` (None for what the run did not reach or the
    backend does not report)."""
    searched = row["held / budget at L"] and row["held / budget at L"] * budget
    held = run["step_held"]
    seen = allocator_footprint(run["before"], run["after"])
    footprint = seen and seen["footprint"]
    return {
        "run_loss": run["loss"],
        "run_held": held and held / MiB,
        "run_over_search": held / searched if held and searched else None,
        "run_footprint": footprint and footprint / MiB,
        "run_footprint_over_held": footprint / held if footprint and held else None,
        "run_memory": run_memory_sentence(run, budget),
    }
