"""Chapter 8's figures, derived from the rows, fusions and timings its experiments return,
and chapter 9's verdict on its causal speedups."""

import jax.numpy as jnp
import numpy as np

from jaxloops.measure.throughput import TWO_FREE_CORES

MiB = 2**20


def scores_bytes(batch: int, heads: int, length: int) -> int:
    """Bytes of one float32 (B, N, T, S) array with T = S = `length`."""
    return batch * heads * length * length * 4


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


def paired_ratios(a: dict, b: dict) -> list[float]:
    """a's time over b's, call by call (rows with "samples"), sorted."""
    return sorted(x / y for x, y in zip(a["samples"], b["samples"]))


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
    exp_ratios = paired_ratios(softmax, no_exp)  # softmax / control, call by call
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
        "qk_vs_square": float(np.median(paired_ratios(qk, square))),
        "mix_vs_square": float(np.median(paired_ratios(mix, square))),
        "no_exp_ms": float(no_exp["seconds"] * 1e3),
        "exp_ratio": float(np.median(exp_ratios)),
        "exp_ratio_low": float(exp_ratios[0]),
        "exp_ratio_high": float(exp_ratios[-1]),
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


# Chapter 9's goal: causal blockwise attention with its defaults, at every T >= 1024 of the
# sweep, at least CAUSAL_GOAL times as fast as the full call, on the 2-core CPU the defaults
# were tuned on with both cores free. Elsewhere the page checks CAUSAL_FLOOR at T >= 2048.
# The tiles' scores predict 1.78 and a call that skipped nothing would read about 1 (XLA's
# does); quiet builds read 1.37 to 1.61 at T = 1024, so a goal of 1.4 failed a fresh-clone
# CI build (1.37), and the goal sits an eighth under the lowest quiet reading.
CAUSAL_GOAL, CAUSAL_FLOOR = 1.2, 1.1


def on_tuned_machine(cores: float, cpu_count: int, backend: str) -> bool:
    """Whether a build runs where chapter 9's defaults were tuned: a 2-core CPU with at least
    `TWO_FREE_CORES` free (`free_cores`)."""
    return backend == "cpu" and cpu_count == 2 and cores >= TWO_FREE_CORES


def _off_the_tuned_machine(cores: float, cpu_count: int, backend: str) -> str:
    """What a build off the tuned machine found: the clause chapter 9's verdicts end with."""
    if backend == "cpu":
        return f"this build found {cores:.2f} of {cpu_count} cores free"
    return f"this build runs on a {backend}, where the defaults were never tuned"


def causal_goal(speedups: dict[int, float], cores: float, cpu_count: int, backend: str):
    """The causal speedups (T -> full / causal, T >= 1024) against chapter 9's goal: (the
    claims they contradict, the sentence that says what was checked, the lengths checked).

    `on_tuned_machine`: at least CAUSAL_GOAL at every T. Elsewhere (a core taken, another
    CPU, a GPU) at least CAUSAL_FLOOR at T >= 2048 only: with a core taken, busy builds read
    1.03 to 1.49 at T = 1024, where the tiles run unrolled, and 1.56 to 1.60 at T = 2048.
    """
    if not speedups:
        raise ValueError("no causal speedup at T >= 1024 to check")
    tuned = on_tuned_machine(cores, cpu_count, backend)
    bound = CAUSAL_GOAL if tuned else CAUSAL_FLOOR
    checked = sorted(T for T in speedups if tuned or T >= 2048)
    failed = [
        f"causal >= {bound}x full at T = {T}: {speedups[T]:.2f}"
        for T in checked
        if speedups[T] < bound
    ]
    if tuned:
        sentence = (
            f"the page checks {bound} at every T ≥ 1024 (a call that skipped nothing would read "
            f"about 1), on every build that finds both cores of a 2-core CPU free, the machine "
            f"the defaults were tuned on ({cores:.2f} cores free here)"
        )
    else:
        sentence = (
            f"the page checks {bound} at T ≥ 2048 only: the goal, {CAUSAL_GOAL} at every "
            f"T ≥ 1024, is set for a 2-core CPU with both cores free, and "
            f"{_off_the_tuned_machine(cores, cpu_count, backend)}"
        )
    return failed, sentence, checked


def unroll_findings(ratio: dict[str, float], cores: float, cpu_count: int, backend: str):
    """Chapter 9's control at T = 1024 (`ratio`: each call's full / call time, paired medians,
    for "causal", "causal, unroll=False" and "full, unroll=True"): (the claims it
    contradicts, the clause that reports unrolled over walked).

    Always: full attention unrolled is no faster than walked (at most 1.05). `on_tuned_machine`
    only: the unrolled causal call is faster than the walked one.
    """
    gain = ratio["causal"] / ratio["causal, unroll=False"]  # the same tiles: unrolled / walked
    tuned = on_tuned_machine(cores, cpu_count, backend)
    claims = {
        f"full attention no faster unrolled: {ratio}": ratio["full, unroll=True"] <= 1.05,
        f"unrolled causal faster than walked: {ratio}": gain > 1 or not tuned,
    }
    clause = f"{gain:.2f} times as fast as walked" + (
        ", faster, as the page checks on the 2-core CPU the defaults were tuned on, both cores free"
        if tuned
        else "; the page checks the direction only on the 2-core CPU the defaults were tuned "
        f"on, with both cores free, and {_off_the_tuned_machine(cores, cpu_count, backend)}"
    )
    return [claim for claim, holds in claims.items() if not holds], clause
