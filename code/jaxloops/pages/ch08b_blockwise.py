"""Chapter 8b's page: the online softmax's walk, the gradient's scratch, and blockwise's
kernels and tiles against the roofline (book/08b_blockwise.md)."""

import numpy as np

from jaxloops.measure.roofline import raise_roofline
from jaxloops.pages.ch08_attention import scores_bytes
from jaxloops.pages.common import MiB
from jaxloops.pages.render import subplots


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
            "This backend's trace does not name the fusions inside the loop, so the column "
            "is empty here; the timings below still apply."
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


def grad_memory_figures(memory: list[dict], batch: int, heads: int, length: int) -> dict:
    """Forward and gradient scratch (MiB) of naive, blockwise with its custom VJP, and
    blockwise under plain `jax.grad` (`memory`'s rows, in that order)."""
    naive, block, plain = memory
    return {
        "T_mem": length,
        "naive_grad_mib": float(naive["grad"]),
        "block_grad_mib": float(block["grad"]),
        "plain_grad_mib": float(plain["grad"]),
        "plain_ratio": float(plain["grad"] / block["grad"]),
        "grad_ratio": float(naive["grad"] / block["grad"]),
        "plain_scores_copies": float(plain["grad"] * MiB / scores_bytes(batch, heads, length)),
        "naive_fwd_mib": float(naive["forward"]),
        "block_fwd_mib": float(block["forward"]),
    }


def memory_rows(programs: dict, scratch) -> list[dict]:
    """One row per implementation ({name: attention function}, in order) of the forward and
    `jax.grad` scratch in MiB; `scratch(fn, grad)` returns `measure.scratch_or_refusal`'s
    dict. A program the backend refused to compile for want of memory (XLA:TPU, a program
    larger than the chip) counts the temporaries its refusal names, and "fits" says so."""
    rows = []
    for name, fn in programs.items():
        forward, grad = scratch(fn, False), scratch(fn, True)
        refused = {k: s["refused"] for k, s in (("forward", forward), ("grad", grad))
                   if s["refused"]}  # fmt: skip
        fits = "yes"
        if refused:
            fits = "no: " + "; ".join(
                f"{k} refused, {r['temp_bytes'] / 2**30:.2f} GiB asked of "
                f"{r['available_bytes'] / 2**30:.2f}"
                for k, r in refused.items()
            )
        rows.append({
            "implementation": name,
            "forward": forward["temp_bytes"] / MiB,
            "grad": grad["temp_bytes"] / MiB,
            "fits": fits,
            "refused": refused,
        })  # fmt: skip
    return rows


def refused_note(memory: list[dict]) -> str:
    """The sentences on the programs of `memory_rows` that did not compile for want of memory
    (none on a CPU)."""
    refused = [(row["implementation"], kind, r) for row in memory
               for kind, r in row["refused"].items()]  # fmt: skip
    if not refused:
        return "Every one of these programs compiled."
    said = "; ".join(
        f'"{name}" ({"its gradient" if kind == "grad" else "its forward pass"}) asks for '
        f"{r['temp_bytes'] / 2**30:.2f} GiB of temporaries, and the device has "
        f"{r['available_bytes'] / 2**30:.2f} GiB of {r['memory']}"
        for name, kind, r in refused
    )
    return (
        f"The compiler refused to build what does not fit: {said}, so it cannot run on that "
        f"device at all; the table counts the temporaries the refusal names (the compiler's "
        f"own count, to 0.01 GiB)."
    )
