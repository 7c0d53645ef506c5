"""Chapter 8's page: attention's scratch, FLOPs and latency against T, predicted and
measured; what XLA fuses; the fused kernels and the numerics (book/08_attention.md)."""

import jax.numpy as jnp

from jaxloops.measure.timing import paired_ratio
from jaxloops.pages.common import MiB
from jaxloops.pages.render import subplots


def scores_bytes(batch: int, heads: int, length: int) -> int:
    """Bytes of one float32 (B, N, T, S) array with T = S = `length`."""
    return batch * heads * length * length * 4


def growth_figures(rows: dict, lengths, batch: int, heads: int) -> dict:
    """Scratch and FLOPs at the two longest lengths: growth per doubling, and the scratch at
    the longest in MiB and in (B, N, T, S) arrays. `rows`: (implementation, T) -> sweep row."""
    if len(lengths) < 2:
        raise ValueError(f"growth needs two lengths, got {list(lengths)}")
    last, previous = lengths[-1], lengths[-2]
    mem = {(name, t): row["temp_bytes"] for (name, t), row in rows.items()}
    scores = scores_bytes(batch, heads, last)
    return {
        "T_prev": previous,
        "naive_mem_growth": float(mem["naive", last] / mem["naive", previous]),
        "flop_growth": float(rows["naive", last]["flops"] / rows["naive", previous]["flops"]),
        "block_mem_growth": float(mem["blockwise", last] / mem["blockwise", previous]),
        "naive_mem_mib": float(mem["naive", last] / MiB),
        "xla_mem_mib": float(mem["xla", last] / MiB),
        "block_mem_mib": float(mem["blockwise", last] / MiB),
        "mem_ratio": float(mem["naive", last] / mem["blockwise", last]),
        "scores_mib": float(scores / MiB),
        "naive_scores_copies": float(mem["naive", last] / scores),
    }


def prediction_figures(prediction: dict, roof, length: int) -> dict:
    """The roofline and its predictions at T = `length`; `prediction`: name -> (seconds,
    bound, bytes moved)."""
    naive_seconds, naive_bound, naive_bytes = prediction["naive"]
    return {
        "T_timed": length,
        "peak_gflops": float(roof.flops_per_s / 1e9),
        "peak_spread": float(100 * roof.spread("flops")),
        "bandwidth": float(roof.bytes_per_s / 1e9),
        "naive_pred_ms": float(naive_seconds * 1e3),
        "block_pred_ms": float(prediction["blockwise"][0] * 1e3),
        "naive_bytes_ms": float(naive_bytes / roof.bytes_per_s * 1e3),
        "naive_gib": float(naive_bytes / 2**30),
        "naive_bound": naive_bound,
    }


def prediction_table(rows: dict, prediction: dict, names: dict, length: int) -> list[dict]:
    """Predicted against measured milliseconds at T = `length`, one row per implementation."""
    return [
        {
            "implementation": names[name],
            "predicted": prediction[name][0] * 1e3,
            "measured": rows[name, length]["seconds"] * 1e3,
            "ratio": rows[name, length]["seconds"] / prediction[name][0],
            "bound": prediction[name][1],
        }
        for name in names
    ]


def timing_figures(rows: dict, prediction: dict, length: int) -> dict:
    """Measured milliseconds at T = `length`, each against its prediction and naive's."""
    seconds = {name: rows[name, length]["seconds"] for name in ("naive", "xla", "blockwise")}
    ratio = {name: seconds[name] / prediction[name][0] for name in seconds}
    return {
        "naive_ms": float(seconds["naive"] * 1e3),
        "xla_ms": float(seconds["xla"] * 1e3),
        "block_ms": float(seconds["blockwise"] * 1e3),
        "naive_ratio": float(ratio["naive"]),
        "xla_ratio": float(ratio["xla"]),
        "block_ratio": float(ratio["blockwise"]),
        "block_speedup": float(seconds["naive"] / seconds["blockwise"]),
        "xla_vs_naive": float(seconds["xla"] / seconds["naive"]),
    }


def full_size(fusions: list[dict], elements: int) -> list[dict]:
    """The fusions whose result has at least `elements` elements (a whole score array)."""
    return [f for f in fusions if f["elements"] >= elements]


def softmax_home(fusions: list[dict], length: int) -> str:
    """Which matmul's kernel the exponentials were fused into: the one making T x S, or the
    other."""
    home = [f for f in fusions if "dot" in f["ops"] and "exponential" in f["ops"]]
    if not home:
        return "a kernel of its own"
    if home[0]["elements"] >= length * length:
        return "the first matmul (it writes the weights)"
    return "the second matmul (it reads the scores)"


def fusion_figures(naive: list[dict], xla: list[dict], elements: int, length: int) -> dict:
    """How naive's and XLA's programs are cut into kernels: counts, where the exponentials
    went, and the passes over a whole score array (of `elements` elements)."""
    passes = lambda fs: "; ".join(f"{f['fusion']} ({f['ops']})" for f in full_size(fs, elements))  # noqa: E731
    return {
        "naive_fusions": len(naive),
        "xla_fusions": len(xla),
        "naive_softmax_home": softmax_home(naive, length),
        "xla_softmax_home": softmax_home(xla, length),
        "naive_full_passes": passes(naive),
        "xla_full_passes": passes(xla),
    }


def parts_figures(parts: list[dict]) -> dict:
    """Naive attention's parts against their predictions and their controls (rows of
    `naive_attention_parts` with "predicted" and "ratio")."""
    part = {p["part"]: p for p in parts}
    softmax, whole = part["softmax"], part["whole (naive)"]
    no_exp, square = (
        part["control: softmax, exp → 1 / (1 - x)"],
        part["control: square matmul, FLOPs of Q Kᵀ"],
    )
    qk, mix = part["scores: Q Kᵀ"], part["mix: weights V"]
    exp_ratios = [x / y for x, y in zip(softmax["samples"], no_exp["samples"])]  # call by call
    moves = [p for p in parts if p is not whole and not p["part"].startswith("control")]
    worst = max(moves, key=lambda p: p["seconds"] - p["predicted"])
    return {
        "whole_ms": float(whole["seconds"] * 1e3),
        "whole_pred_ms": float(whole["predicted"] * 1e3),
        "qk_ms": float(qk["seconds"] * 1e3),
        "qk_ratio": float(qk["ratio"]),
        "mix_ms": float(mix["seconds"] * 1e3),
        "mix_ratio": float(mix["ratio"]),
        "softmax_ms": float(softmax["seconds"] * 1e3),
        "softmax_pred_ms": float(softmax["predicted"] * 1e3),
        "softmax_ratio": float(softmax["ratio"]),
        "worst_part": worst["part"],
        "square_part_ms": float(square["seconds"] * 1e3),
        "qk_vs_square": paired_ratio(qk["samples"], square["samples"]),
        "mix_vs_square": paired_ratio(mix["samples"], square["samples"]),
        "no_exp_ms": float(no_exp["seconds"] * 1e3),
        "exp_ratio": paired_ratio(softmax["samples"], no_exp["samples"]),
        "exp_ratio_low": float(min(exp_ratios)),
        "exp_ratio_high": float(max(exp_ratios)),
        "worst_excess_ms": float((worst["seconds"] - worst["predicted"]) * 1e3),
        "exp_per_ns": float(softmax["transcendentals"] / softmax["seconds"] / 1e9),
        "parts_share": float(softmax["seconds"] / whole["seconds"] * 100),
        "control_exponentials": no_exp["transcendentals"],
        "control_bytes_ratio": no_exp["bytes_accessed"] / softmax["bytes_accessed"],
        "square_flops_ratio": square["flops"] / qk["flops"],
    }


def formula_ratios(rows: dict, short: int, long: int, formula, batch: int, heads: int) -> dict:
    """Naive's compiled scratch against `formula(B, N, T, S, dtype)` (an exercise's answer) at
    a short and a long T = S, and the formula's MiB at the long one."""

    bytes_at = {t: formula(batch, heads, t, t, jnp.float32) for t in (short, long)}
    return {
        "ex_T_short": short,
        "ex_formula_mib": float(bytes_at[long] / MiB),
        "ex_ratio_long": float(rows["naive", long]["temp_bytes"] / bytes_at[long]),
        "ex_ratio_short": float(rows["naive", short]["temp_bytes"] / bytes_at[short]),
    }


def log2_axes(*axes) -> None:
    from matplotlib.ticker import ScalarFormatter

    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(ScalarFormatter())


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
            [rows[name, t]["temp_bytes"] / MiB for t in lengths],
            label=names[name] + (xla_note if name == "xla" else ""),
            **styles[name],
        )
    mem_ax.loglog(
        lengths,
        [batch * heads * t * t * 4 / MiB for t in lengths],
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
    log2_axes(mem_ax, flop_ax)
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
    log2_axes(ax)
    ax.set(xlabel="sequence length T = S (tokens)", ylabel="median latency (ms)", title=title)
    ax.legend(fontsize=7)
    return fig


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
