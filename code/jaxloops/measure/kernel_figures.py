"""Chapter 8's figures on blockwise's kernels and tiles, on the fused kernels, and on numerics."""

from jaxloops.measure.attention_figures import MiB
from jaxloops.measure.roofline import raise_roofline


def tile_passes(loop_fusions: list[dict], tile_rows: int, block: int):
    """The loop's fusions over a (rows, block) score tile, and the traced split of a call
    between the matmul fusions and the softmax passes (max, exponentials, sum), in ms; the
    split is None where the trace names no fusion ("ms" None for all)."""
    score_sized = [f for f in loop_fusions if f["dims"][-2:] == (tile_rows, block)]
    timed = [f for f in loop_fusions if f["ms"] is not None]
    if not timed:
        return score_sized, None
    passes = [
        f for f in timed if "dot" not in f["ops"] and ("reduce" in f["ops"] or f in score_sized)
    ]
    return score_sized, {
        "dots_ms": sum(f["ms"] for f in timed if "dot" in f["ops"]),
        "softmax_ms": sum(f["ms"] for f in passes),
    }


def trace_note(split: dict | None, traced_ms: float, dots_pred_ms: float) -> str:
    """The paragraph on the trace's split (from `tile_passes`) against the roofline."""
    if split is None:
        return (
            "This backend's trace does not name the operations inside the loop (a GPU's "
            "names whole programs), so the column is empty here; the timings below "
            "still apply."
        )
    dots_ms, softmax_ms = split["dots_ms"], split["softmax_ms"]
    return (
        f"In the trace, the two matmul fusions took {dots_ms:.0f} ms per call, "
        f"{dots_ms / dots_pred_ms:.2f} times the {dots_pred_ms:.0f} ms the roofline allows "
        f"their FLOPs ({100 * dots_pred_ms / dots_ms:.0f} % of the ceiling, sampled again "
        f"beside the same calls just before the trace), and "
        f"{100 * dots_ms / traced_ms:.0f} % of the {traced_ms:.0f} ms the trace accounts "
        f"for; the passes over the score tile between them (maximum, exponentials, sum) "
        f"took {softmax_ms:.0f} ms, {100 * softmax_ms / traced_ms:.0f} %. Beyond the "
        f"roofline's prediction, blockwise spends those passes, run one after the other, "
        f"and whatever its matmuls fall short of the ceiling: a kernel written by hand "
        f"would overlap the exponentials of one tile with the matmul of the next."
    )


def square_against_ceiling(square_rate: float, roof):
    """The square matmul's rate against the ceiling. It is the roofline's own kind of work,
    timed beside blockwise: where it ran faster than every earlier sample, it is a better
    sample of the ceiling, and raises the build's roofline (`raise_roofline`).

    Returns:
      (roofline now, the rate's fraction of its FLOP/s, the sentence saying if it was raised)
    """
    raised = square_rate > roof.flops_per_s
    if raised:
        roof = raise_roofline(flops_samples=[square_rate])
    note = (
        f" (it was faster than every earlier sample, so it raised the build's ceiling to "
        f"{roof.flops_per_s / 1e9:.0f} GFLOP/s; the predictions above used the earlier one)"
        if raised
        else ""
    )
    return roof, square_rate / roof.flops_per_s, note


def tile_figures(tile_parts: list[dict], tile_rows: int, block: int) -> dict:
    """Blockwise's tile parts (`blockwise_tile_parts` rows): the parts' sum against the whole
    loop, the tile's size, and the square matmul of the same FLOPs (its rate in FLOP/s)."""
    part = {p["part"].strip(): p for p in tile_parts}
    step, qk = part["online softmax step (all of it)"], part["scores: Q Kᵀ"]
    whole, square = part["whole (blockwise)"], part["square matmul, same FLOPs"]
    return {
        "tile_total_ms": float((qk["seconds"] + step["seconds"]) * 1e3),
        "tile_whole_ms": float(whole["seconds"] * 1e3),
        "tile_rows": tile_rows,
        "tile_mib": float(tile_rows * block * 4 / MiB),
        "square_ms": float(square["seconds"] * 1e3),
        "square_rate": square["flops"] / square["seconds"],  # both for all calls
        "block_vs_square": float(whole["seconds"] / square["seconds"]),
    }


def cudnn_figures(report: list[dict]) -> dict:
    """Whether any cuDNN request ran (`implementation_report` rows), and the first refusal."""
    cudnn = [r for r in report if r["implementation"] == "cudnn"]
    error = next((r["error"] for r in cudnn if not r["works"]), "")
    return {
        "cudnn_status": "ran, and its program contains the fused-attention call"
        if any(r["works"] for r in cudnn)
        else "refused every request",
        "cudnn_error": error or "none",
    }


def numerics_figures(numerics: list[dict]) -> dict:
    """The worst error of each dtype (`numerics_table` rows that ran), and the bfloat16 errors
    of naive, XLA and blockwise."""
    ran = [r for r in numerics if r["max_abs_error"] is not None]
    worst = {}
    for row in ran:
        worst[row["dtype"]] = max(worst.get(row["dtype"], 0.0), row["max_abs_error"])
    return {
        "err_f32": float(worst["float32"]),
        "err_bf16": float(worst["bfloat16"]),
        "bf16_errors": [
            r["max_abs_error"]
            for r in ran
            if r["dtype"] == "bfloat16" and r["implementation"] in ("naive", "xla", "blockwise")
        ],
    }
