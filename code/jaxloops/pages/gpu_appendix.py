"""The recorded GPU run (results/gpu/results.json: one H200, 2026-12-04) and how the book
shows it: the GPU appendix's tables, goals and plot, and the sidebars of chapters 5, 6 and 8.

The GPU-only script that wrote it is gone: its benchmarks are the chapters themselves now,
executed on any accelerator by scripts/device_run.py, which records in results/<backend>/
(book/_ext/device_records.py renders those). This module only reads and renders the file;
it measures nothing.
"""

import json
import pathlib

from jaxloops.measure.comms import critical_batch
from jaxloops.measure.published import PublishedPeaks, published_peaks
from jaxloops.pages.render import markdown_table

# Top-level sections the results file has, and what each holds. The run wrote the file after
# every stage, so a section may be empty where a stage timed out or failed.
RESULT_SECTIONS = {
    "facts": "device, driver, CUDA/cuDNN and package versions, date, rehearsal or not",
    "plan": "the sizes the run used (lengths, goal length, B, N, H, ...) and the timing floor",
    "stages": "each stage's status (ok, failed, timeout, skipped, pending), seconds and detail",
    "implementations": "which attention implementations work, one row per case",
    "ceilings": "measured matmul FLOP/s at f32 (HIGHEST), TF32 (DEFAULT) and bf16",
    "bandwidth": "measured memory read bytes/s",
    "attention": "attention sweep rows (implementation, dtype, T, seconds, ...)",
    "causal": "causal vs full attention rows",
    "mlp": "device-loop throughput rows of the MLP at large batch (float32, HIGHEST)",
}

STATUSES = ("ok", "failed", "timeout", "skipped", "pending")

# A goal is met within this factor of the roofline's prediction: at least half the
# predicted throughput, at least half the predicted speedup.
ROOFLINE_TOLERANCE = 2.0
# Passes over the (B, N, T, S) scores that any unfused attention makes at least: it writes
# them once and reads them once.
SCORE_PASSES = 2


def check_results(results: dict) -> dict:
    """Raises ValueError naming what a results file lacks; returns it unchanged otherwise."""
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
    for name, stage in results["stages"].items():
        if stage.get("status") not in STATUSES:
            status = stage.get("status")
            raise ValueError(f"stage {name!r} has status {status!r}; expected one of {STATUSES}")
    return results


# Where a recorded GPU run is committed: results/gpu/results.json at the repository root
# (this file is code/jaxloops/measure/gpu_report.py: three folders below the root).
REPOSITORY_ROOT = pathlib.Path(__file__).resolve().parents[3]
RECORDED_RESULTS = REPOSITORY_ROOT / "results" / "gpu" / "results.json"


def load_results(path=None) -> dict | None:
    """The recorded results at `path` (default: `RECORDED_RESULTS`), checked; None where no
    run has been recorded."""
    path = pathlib.Path(RECORDED_RESULTS if path is None else path)
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


def attention_bytes(
    *, batch: int, heads: int, length: int, head_dim: int, itemsize: int, materialised: bool
) -> float:
    """Bytes attention must move at T = S: Q, K and V read and O written (4·B·T·N·H items);
    an implementation that materialises the (B, N, T, S) scores also writes and reads them
    (SCORE_PASSES passes)."""
    items = 4.0 * batch * length * heads * head_dim
    if materialised:
        items += SCORE_PASSES * batch * heads * length * length
    return items * itemsize


def ceiling(results: dict, name: str) -> float | None:
    """Measured FLOP/s of ceiling "f32", "tf32" or "bf16"; None if it was not measured."""
    for row in results["ceilings"]:
        if row["name"] == name and row.get("flops_per_s"):
            return row["flops_per_s"]
    return None


def recorded_critical_batch(results: dict | None) -> list[dict] | None:
    """Chapter 12's critical batch C / W (data parallel and FSDP alike) for the board of a GPU
    run, twice: with the board's published bfloat16 peak for C, and with the bfloat16 matmul
    ceiling the run measured. W is the published ring bandwidth: one GPU has no link to
    time. None where there is no run, no bf16 ceiling, or no published figures for the board.
    """
    if not results:
        return None
    peaks = published_peaks(results["facts"]["device_kind"])
    measured = ceiling(results, "bf16")
    if peaks is None or peaks.ring_bytes_per_s is None or measured is None:
        return None
    link = peaks.ring_bytes_per_s
    return [
        {
            "C from": source,
            "bf16 TFLOP/s": flops / 1e12,
            "ring GB/s (published)": link / 1e9,
            "critical B/n": f"{critical_batch(flops, link, forward=0, backward=2):,.0f}",
        }
        for source, flops in (
            (f"{peaks.board}, published", peaks.bf16_flops_per_s),
            ("this run's bf16 matmul ceiling", measured),
        )
    ]


def roofline_for_goals(results: dict) -> tuple[PublishedPeaks | None, str]:
    """The roofline the goals use, and its label: the device's published figures where this
    package lists the board, else the run's own measured ceilings (None if those are absent)."""
    kind = results["facts"]["device_kind"]
    peaks = published_peaks(kind)
    if peaks is not None:
        return peaks, f"published: {peaks.board}, {peaks.source}"
    flops = {name: ceiling(results, name) for name in ("f32", "tf32", "bf16")}
    bandwidth = results["bandwidth"].get("bytes_per_s")
    if not all(flops.values()) or not bandwidth:
        return None, f"no published figures for {kind!r} and no measured ceilings"
    measured = PublishedPeaks(
        kind,
        f32_flops_per_s=flops["f32"],
        tf32_flops_per_s=flops["tf32"],
        bf16_flops_per_s=flops["bf16"],
        hbm_bytes_per_s=bandwidth,
        source="measured by this run",
    )
    return measured, f"measured by this run (no published figures for {kind!r})"


def ceiling_rows(results: dict) -> list[dict]:
    """The ceiling table: each measured matmul precision and the read bandwidth, next to the
    device's published figure (None where none is listed)."""
    peaks = published_peaks(results["facts"]["device_kind"])
    rows = []
    for row in results["ceilings"]:
        published = peaks.flops_per_s(row["name"]) if peaks else None
        rows.append(_ceiling_row(row["label"], row.get("flops_per_s"), published, row))
    bandwidth = results["bandwidth"]
    if bandwidth:
        published = peaks.hbm_bytes_per_s if peaks else None
        measured = bandwidth.get("bytes_per_s")
        rows.append(_ceiling_row("memory read (bytes/s)", measured, published, bandwidth))
    return rows


def _ceiling_row(label: str, measured, published, row: dict) -> dict:
    ran = bool(measured) and bool(published)
    return {
        "ceiling": label,
        "measured": measured,
        "published": published,
        "of published": f"{100 * measured / published:.0f} %" if ran else None,
        "error": row.get("error", ""),
    }


def _attention_row(results: dict, implementation: str, length: int) -> dict | None:
    for row in results["attention"]:
        key = (row["implementation"], row["dtype"], row["T"], row.get("is_causal", False))
        if key == (implementation, "bfloat16", length, False):
            return row
    return None


def goals(results: dict) -> list[dict]:
    """The GPU goals of the book, each with the measured value and whether it was met.

    Thresholds come from the roofline (`roofline_for_goals`): cuDNN's bf16 attention at the
    goal length runs within ROOFLINE_TOLERANCE of the roofline's prediction, and its speedup
    over naive attention is at least 1 / ROOFLINE_TOLERANCE of the predicted speedup.
    """
    check_results(results)
    plan = results["plan"]
    peaks, source = roofline_for_goals(results)
    length = plan.get("goal_length")
    shape = {k: plan.get(k) for k in ("batch", "heads", "head_dim")}
    fraction_goal = (
        f"cuDNN attention, T = S = {length}, bf16: ≥ {100 / ROOFLINE_TOLERANCE:.0f} % "
        f"of the roofline ({source})"
    )
    speedup_goal = (
        f"cuDNN over naive attention, T = S = {length}, bf16: ≥ 1/{ROOFLINE_TOLERANCE:g} "
        f"of the speedup the roofline predicts ({source})"
    )
    if peaks is None or None in shape.values() or length is None:
        why = f"not measured: {source}" if peaks is None else "not measured: no plan"
        return [{"goal": g, "measured": why, "met": False} for g in (fraction_goal, speedup_goal)]

    def predict(materialised: bool) -> float:
        flops = attention_flops(**shape, length=length, is_causal=False)
        moved = attention_bytes(**shape, length=length, itemsize=2, materialised=materialised)
        return peaks.predict(flops, moved, "bf16")

    cudnn = _attention_row(results, "cudnn", length)
    naive = _attention_row(results, "naive", length)
    return [
        _fraction_goal(fraction_goal, cudnn, predict(False), length),
        _speedup_goal(speedup_goal, cudnn, naive, predict(True) / predict(False)),
        *_reported_goals(results),
    ]


def _not_measured(goal: str, *rows, missing: str) -> dict:
    why = next((row["error"] for row in rows if row and row.get("error")), missing)
    return {"goal": goal, "measured": f"not measured: {why}", "met": False}


def _fraction_goal(goal: str, cudnn: dict | None, predicted: float, length: int) -> dict:
    """cuDNN's measured time against the roofline's `predicted` seconds."""
    if not (cudnn and cudnn.get("seconds")):
        return _not_measured(goal, cudnn, missing=f"no cuDNN bf16 row at T = S = {length}")
    fraction = predicted / cudnn["seconds"]
    measured = (
        f"{100 * fraction:.1f} % (predicted {1e3 * predicted:.3g} ms, "
        f"measured {1e3 * cudnn['seconds']:.3g} ms)"
    )
    return {"goal": goal, "measured": measured, "met": fraction >= 1 / ROOFLINE_TOLERANCE}


def _speedup_goal(goal: str, cudnn: dict | None, naive: dict | None, predicted: float) -> dict:
    """Naive / cuDNN measured, against the `predicted` speedup."""
    if not (cudnn and cudnn.get("seconds") and naive and naive.get("seconds")):
        return _not_measured(goal, naive, cudnn, missing="a row is missing")
    speedup = naive["seconds"] / cudnn["seconds"]
    return {
        "goal": goal,
        "measured": f"{speedup:.1f}× (predicted {predicted:.1f}×)",
        "met": speedup >= predicted / ROOFLINE_TOLERANCE,
    }


def _reported_goals(results: dict) -> list[dict]:
    """The figures reported with no threshold (met None): the MLP loop's share of the f32
    ceiling and the book's build."""
    rows = []
    f32_ceiling = ceiling(results, "f32")
    if results["mlp"] and f32_ceiling:
        best = max(results["mlp"], key=lambda r: r["flops_per_s"])
        rows.append(
            {
                "goal": "MLP device loop, float32 (HIGHEST): fraction of the measured f32 "
                "matmul ceiling (reported)",
                "measured": f"{100 * best['flops_per_s'] / f32_ceiling:.1f} % "
                f"at batch {best['batch_size']}",
                "met": None,
            }
        )
    chapters = results.get("book_chapters", {})
    if chapters:
        passed = [name for name, c in chapters.items() if c["status"] == "ok"]
        rows.append(
            {
                "goal": "the GPU chapters executed strictly on the GPU (reported)",
                "measured": f"{len(passed)} of {len(chapters)} recorded passed"
                + "".join(f"; {n} {c['status']}" for n, c in chapters.items() if n not in passed),
                "met": None,
            }
        )
    return rows


def compiled_flops_note(results: dict | None) -> str:
    """Chapter 5's parenthesis: the recorded run's compiled FLOP count of chapter 6's MLP step
    at its largest batch beside the lowered count (the file keeps the compiled count where a
    correction replaced it), or a plain statement that no such run is recorded."""
    rows = [r for r in (results or {}).get("mlp", []) if "compiled_flops_per_step_on_gpu" in r]
    if not rows:
        return "no GPU run is recorded in this copy to show it"
    big = max(rows, key=lambda r: r["batch_size"])
    return (
        f"the recorded {results['facts']['device_kind']} run's compiled count of chapter 6's "
        f"MLP step at batch {big['batch_size']:,} was "
        f"{big['compiled_flops_per_step_on_gpu'] / 1e9:.1f} GFLOP; the lowered count is "
        f"{big['flops_per_step'] / 1e9:.0f} GFLOP"
    )


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
        f32 = ceiling(results, "f32")
        rows = [
            {
                "batch": r["batch_size"],
                "steps/s": r["steps_per_s"],
                "of f32 ceiling": f"{100 * r['flops_per_s'] / f32:.0f} %" if f32 else None,
            }
            for r in results["mlp"]
        ]
        table = markdown_table(
            rows, {"batch": "batch", "steps/s": "steps/s", "of f32 ceiling": "of ceiling"}
        )
    elif rows_for == "attention":
        longest = max((r["T"] for r in results["attention"]), default=None)
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
    """Latency against T = S of every recorded (implementation, dtype) that ran, log-log."""
    series = {}
    for row in results["attention"]:
        if row.get("seconds"):
            name = row["implementation"] + (" causal" if row.get("is_causal") else "")
            series.setdefault((name, row["dtype"]), []).append((row["T"], row["seconds"]))
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


def appendix_tables(results: dict) -> dict[str, str]:
    """The appendix's tables of a recorded run, as Markdown, in the order the page shows them
    (its plot of `plot_attention` goes before "attention"); "causal" and "chapters" (each
    chapter's strict execution on the GPU) only where recorded."""
    verdict = {True: "yes", False: "**no**", None: "reported"}
    columns = {
        "facts": {"fact": "fact", "value": "value"},
        "stages": {"stage": "stage", "status": "status", "seconds": "seconds", "detail": "detail"},
        "chapters": {"chapter": "chapter", "status": "status", "seconds": "seconds",
                     "detail": "detail"},
        "ceilings": dict.fromkeys(["ceiling", "measured", "published", "of published", "error"]),
        "goals": {"goal": "goal", "measured": "measured", "met": "met"},
        "attention": {
            "implementation": "implementation", "dtype": "dtype", "T": "T = S",
            "seconds": "seconds", "calls_per_sample": "calls per sample",
            "temp_bytes": "temp bytes", "error": "error",
        },
        "causal": {
            "implementation": "implementation", "T": "T = S", "full_seconds": "full (s)",
            "causal_seconds": "causal (s)", "speedup": "speedup", "error": "error",
        },
        "mlp": {
            "batch_size": "batch", "steps_per_s": "steps/s", "examples_per_s": "examples/s",
            "flops_per_s": "FLOP/s",
        },
    }  # fmt: skip
    rows = {
        "facts": [{"fact": k, "value": v} for k, v in results["facts"].items()],
        "stages": [{"stage": name, **stage} for name, stage in results["stages"].items()],
        "chapters": [
            {"chapter": name, **chapter}
            for name, chapter in results.get("book_chapters", {}).items()
        ],
        "ceilings": ceiling_rows(results),
        "goals": [{**row, "met": verdict[row["met"]]} for row in goals(results)],
        "attention": results["attention"],
        "causal": results["causal"],
        "mlp": results["mlp"],
    }
    columns["ceilings"] = {name: name for name in columns["ceilings"]}
    return {
        name: markdown_table(rows[name], columns[name])
        for name in columns
        if rows[name] or name not in ("causal", "chapters")
    }
