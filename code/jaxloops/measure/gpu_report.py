"""Recorded GPU runs: the facts of the machine, the results file, and how the book shows it.

A GPU run (scripts/gpu_run.sh) writes one JSON file; the book renders it next to the live
build's own figures, labelled with the device and date it was measured on.
"""

import json
import pathlib

from jaxloops.measure.sweeps import markdown_table

# Top-level sections every results file must have, and what each holds.
RESULT_SECTIONS = {
    "facts": "device, driver, CUDA/cuDNN and package versions, date",
    "matmul": "measured matmul FLOP/s per dtype",
    "attention": "attention sweep rows (implementation, dtype, L, seconds, ...)",
    "causal": "causal vs full attention rows",
    "mlp": "device-loop throughput rows of the MLP at large batch",
    "build": "test and book-build wall times in seconds",
}


def check_results(results: dict, *, allow_tiny: bool = False) -> dict:
    """Raises ValueError naming what a results file lacks; returns it unchanged otherwise.

    Args:
      allow_tiny: accept a --tiny pipeline check (the book never does).
    """
    if not isinstance(results, dict):
        raise ValueError(f"a results file holds a JSON object, not {type(results).__name__}")
    missing = [key for key in RESULT_SECTIONS if key not in results]
    if missing:
        raise ValueError(
            f"results file lacks section(s) {missing}; expected {list(RESULT_SECTIONS)}"
        )
    for key in ("date", "device_kind", "backend"):
        if key not in results["facts"]:
            raise ValueError(f"results file's facts lack {key!r}")
    if results["facts"].get("tiny") and not allow_tiny:
        raise ValueError("this results file is a --tiny pipeline check, not a GPU measurement")
    return results


# Where a recorded GPU run is committed: results/gpu/results.json at the repository root.
RECORDED_RESULTS = pathlib.Path(__file__).resolve().parents[2] / "results" / "gpu" / "results.json"


def load_results(path=RECORDED_RESULTS) -> dict | None:
    """The recorded results at `path`, checked; None where no run has been recorded."""
    path = pathlib.Path(path)
    if not path.exists():
        return None
    try:
        results = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error
    return check_results(results)


def attention_flops(
    *, batch: int, heads: int, length: int, head_dim: int, is_causal: bool
) -> float:
    """Matmul FLOPs of attention's two products (Q·Kᵀ and P·V): 4·B·N·T·S·H, halved if causal.

    A fused kernel hides its work from XLA's cost analysis, so its FLOP/s use this count.
    """
    flops = 4.0 * batch * heads * length * length * head_dim
    return flops / 2 if is_causal else flops


def goals(results: dict) -> list[dict]:
    """The GPU goals of the book, each with the measured value and whether it was met."""
    check_results(results, allow_tiny=True)
    rows = []
    config = results.get("attention_config", {})
    by_key = {(r["implementation"], r["dtype"], r["T"]): r for r in results["attention"]}
    cudnn = by_key.get(("cudnn", "bfloat16", 8192))
    naive = by_key.get(("naive", "bfloat16", 8192))
    bf16_ceiling = results["matmul"].get("bfloat16")
    if cudnn and cudnn.get("seconds") and bf16_ceiling and config:
        flops = attention_flops(
            batch=config["batch"],
            heads=config["heads"],
            length=8192,
            head_dim=config["head_dim"],
            is_causal=False,
        )
        fraction = flops / cudnn["seconds"] / bf16_ceiling
        rows.append(
            {
                "goal": "cuDNN attention, T = S = 8192, bf16: ≥ 50 % of bf16 matmul FLOP/s",
                "measured": f"{100 * fraction:.1f} %",
                "met": fraction >= 0.5,
            }
        )
    else:
        why = (cudnn or {}).get("error") or "no cuDNN bf16 row at T = S = 8192"
        rows.append(
            {
                "goal": "cuDNN attention, T = S = 8192, bf16: ≥ 50 % of bf16 matmul FLOP/s",
                "measured": f"not measured: {why}",
                "met": False,
            }
        )
    if cudnn and cudnn.get("seconds") and naive and naive.get("seconds"):
        speedup = naive["seconds"] / cudnn["seconds"]
        rows.append(
            {
                "goal": "cuDNN attention, T = S = 8192, bf16: ≥ 10× naive",
                "measured": f"{speedup:.1f}×",
                "met": speedup >= 10,
            }
        )
    else:
        rows.append(
            {
                "goal": "cuDNN attention, T = S = 8192, bf16: ≥ 10× naive",
                "measured": "not measured (a row is missing or did not run)",
                "met": False,
            }
        )
    f32_ceiling = results["matmul"].get("float32")
    if results["mlp"] and f32_ceiling:
        best = max(results["mlp"], key=lambda r: r["flops_per_s"])
        rows.append(
            {
                "goal": "MLP device loop: fraction of the f32 matmul ceiling (reported)",
                "measured": f"{100 * best['flops_per_s'] / f32_ceiling:.1f} % "
                f"at batch {best['batch_size']}",
                "met": None,
            }
        )
    build = results["build"]
    if "book_seconds" in build:
        rows.append(
            {
                "goal": "strict book build on the GPU (reported)",
                "measured": f"{build['book_seconds']:.0f} s",
                "met": None,
            }
        )
    return rows


def label(results: dict | None) -> str:
    """ "<device>, <date>" for a recorded run, or a plain statement that none is recorded."""
    if results is None:
        return "no GPU run is recorded in this copy of the book"
    facts = results["facts"]
    return f"{facts.get('gpus', facts['device_kind'])}, measured {facts['date']}"


def sidebar(results: dict | None, rows_for: str) -> str:
    """Markdown for a chapter's "Measured on a GPU" sidebar.

    Args:
      rows_for: "mlp" or "attention": which recorded figures the chapter shows.
    """
    if results is None:
        return (
            "No GPU run is recorded in this copy of the book yet; the figures on this "
            "page are from this build's own device. See the appendix *Measured on a GPU*."
        )
    if rows_for == "mlp":
        ceiling = results["matmul"].get("float32")
        rows = [
            {
                "batch": r["batch_size"],
                "steps/s": r["steps_per_s"],
                "of f32 ceiling": f"{100 * r['flops_per_s'] / ceiling:.0f} %" if ceiling else None,
            }
            for r in results["mlp"]
        ]
        table = markdown_table(
            rows, {"batch": "batch", "steps/s": "steps/s", "of f32 ceiling": "of ceiling"}
        )
    elif rows_for == "attention":
        longest = max(r["T"] for r in results["attention"])
        rows = [r for r in results["attention"] if r["T"] == longest]
        table = markdown_table(
            rows,
            {
                "implementation": "implementation",
                "dtype": "dtype",
                "seconds": "seconds",
                "error": "error",
            },
        )
    else:
        raise ValueError(f"rows_for is {rows_for!r}; expected 'mlp' or 'attention'")
    return f"Recorded on {label(results)}:\n\n{table}"


def plot_attention(results: dict, ax) -> None:
    """Latency against L of every recorded (implementation, dtype) that ran, log-log."""
    series = {}
    for row in results["attention"]:
        if row.get("seconds"):
            series.setdefault((row["implementation"], row["dtype"]), []).append(
                (row["T"], row["seconds"])
            )
    for (name, dtype), points in sorted(series.items()):
        points.sort()
        ax.plot(
            [p[0] for p in points],
            [1e3 * p[1] for p in points],
            marker="o",
            label=f"{name} {dtype}",
        )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="sequence length T = S",
        ylabel="latency (ms)",
        title=f"attention on {label(results)}",
    )
    ax.legend(fontsize=8)
