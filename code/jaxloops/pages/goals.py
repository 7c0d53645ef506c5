"""The goals the book's issues set: one table (the goal, the value asked, where it applies),
and the words a page, `book/build_info.md` and `make bench` use for each: met, missed by how
much, or not applicable here and why.

A goal is not a claim. A claim is a direction a page states ("causal is faster"), checked on
every build and backend by the page's own `check`. A goal is a number an issue set; it is
measured by `make bench` (scripts/bench.py), which records its result per machine under
`results/bench/` and exits non-zero when a goal is missed on a machine it applies to; a goal
set for the TPU (chapter 17's kernel) by the device run that records `results/tpu/`. A page
states each goal as set, never a lower one, and when its build misses it says so:
"the goal is X; this build measured Y".
"""

import dataclasses
import json
import os
import pathlib
import re

_ROOT = pathlib.Path(__file__).resolve().parents[3]
# Where `make bench` records each machine's goals, one JSON file per machine.
BENCH_DIR = _ROOT / "results" / "bench"
# Where the chapters of one build leave the goal values they measured, for build_info.
BUILD_GOALS_ENV = "JAXLOOPS_GOALS_DIR"


@dataclasses.dataclass(frozen=True)
class Goal:
    """One goal: `measured >= asked` (`at_least`) or `measured <= asked`."""

    key: str
    chapter: int
    what: str  # what is measured, in the page's words
    asked: float
    at_least: bool
    percent: bool  # shown as a percentage (a share), else as a ratio (×)
    issue: str  # where the value was set
    backend: str = "cpu"  # the backend it was set for (`APPLIES`)

    def show(self, value: float) -> str:
        """A measured value, or a shortfall, to a tenth of a per cent or a thousandth."""
        return f"{value:.1%}" if self.percent else f"{value:.3f}"

    @property
    def asked_text(self) -> str:
        """The value asked, as the issue wrote it: "55 %", "3.3"."""
        return f"{100 * self.asked:g} %" if self.percent else f"{self.asked:g}"

    @property
    def stated(self) -> str:
        """The goal as the issue set it: "≥ 55 %", "≤ 3.3"."""
        return f"{'≥' if self.at_least else '≤'} {self.asked_text}"

    def met(self, measured: float) -> bool:
        if measured != measured:  # NaN meets nothing
            return False
        return measured >= self.asked if self.at_least else measured <= self.asked

    def shortfall(self, measured: float) -> float:
        """How far `measured` is from the goal on the wrong side (0 when met)."""
        gap = self.asked - measured if self.at_least else measured - self.asked
        return max(gap, 0.0)


# The machines the goals were set for, by backend. XLA's CPU backend, where the book's sizes,
# kernels and tilings were tuned: any number of cores (a goal is missed on a 4-core runner as
# on a 2-core one, and the record says how many cores were free). A TPU v5e chip, for chapter
# 17's Pallas kernel: measured by the device run (`measure.kernel_sweep`), not `make bench`.
APPLIES = {"cpu": "XLA's CPU backend", "tpu": "one TPU v5e chip (the device run)"}

GOALS = (
    Goal("validation_hook", 7,
         "`fit` with a validation hook after every epoch, speed as a share of `fit` without one "
         "(median of paired rounds)",
         0.85, at_least=True, percent=True, issue="chapter 7's hook goal"),
    Goal("causal_over_full", 9,
         "causal blockwise attention with its defaults, full time / causal time, the least over "
         "the sweep's T ≥ 1024",
         1.4, at_least=True, percent=False, issue="chapter 9's causal goal"),
    Goal("step_of_ceiling", 11,
         "the train step at `experiment_sizes().lm.goal`: share of the build's float32 matmul "
         "ceiling",
         0.55, at_least=True, percent=True, issue="chapter 11's step goal"),
    Goal("gradient_over_forward", 11,
         "the same step: gradient time / forward time",
         3.3, at_least=False, percent=False, issue="chapter 11's gradient goal"),
    Goal("step_over_pytorch", 11,
         "the step at the goal size, tokens/s over PyTorch eager's, in a plain process (its "
         "PyTorch twin, CPU, float32; median of paired rounds, `make bench`)",
         1.0, at_least=True, percent=False, issue="issue 43"),
    # Issue 43's goals for the chip: each measured by its chapter on every backend (so a CPU
    # build shows its own value, not applicable) and recorded on the TPU by the device run
    # (`device_measured`: the values a recorded chapter left)
    Goal("fit_of_bare_epoch", 7,
         "`fit` (no hook) at the loop's accelerator size: speed as a share of the bare compiled "
         "epoch's (median of paired rounds)",
         0.95, at_least=True, percent=True, issue="issue 43", backend="tpu"),
    Goal("fit_over_python_loop", 7,
         "the same `fit`: speed over a Python loop of jitted steps (median of paired rounds)",
         8.0, at_least=True, percent=False, issue="issue 43", backend="tpu"),
    Goal("decode_gqa_of_roofline", 10,
         "chapter 10's GQA decode step of a whole layer (K = N/4, bfloat16) at the longest "
         "cache: share of its roofline (the slower of its FLOPs at the matmul ceiling and its "
         "weights' and cache's bytes at the read bandwidth, each the best measured by the "
         "build, reads beside the sweep included)",
         0.70, at_least=True, percent=True, issue="issue 43", backend="tpu"),
    Goal("step_bf16_of_ceiling", 11,
         "the train step at `lm.speed` (about 100 M parameters on the chip, T ≥ 1024), "
         "bfloat16 compute with float32 master weights: share of the bfloat16 matmul ceiling "
         "measured beside it",
         0.60, at_least=True, percent=True, issue="issue 43", backend="tpu"),
    Goal("pallas_forward_h128", 17,
         "the Pallas kernel, forward, full attention, T = 8192, H 128 (bfloat16, B 4, N 8): "
         "share of attention's ceiling measured beside it (its products 128 deep at a 128-deep "
         "matmul's rate, the rest at the square matmul's)",
         0.80, at_least=True, percent=True, issue="issue 42", backend="tpu"),
    Goal("pallas_forward_h64", 17,
         "the same at H 64: share of attention's ceiling, its QKᵀ at a 64-deep matmul's rate",
         0.60, at_least=True, percent=True, issue="issue 42", backend="tpu"),
    Goal("pallas_causal_of_ideal", 17,
         "the Pallas kernel's causal speed-up over full (forward), as a share of the ideal "
         "2n/(n + 1) for its n key blocks, the least over T ≥ 4096",
         0.85, at_least=True, percent=True, issue="issue 42", backend="tpu"),
    Goal("pallas_causal_speedup", 17,
         "the same speed-up, full time / causal time, the least over T ≥ 8192",
         1.8, at_least=True, percent=False, issue="issue 42", backend="tpu"),
    Goal("pallas_forward_backward_h128", 17,
         "the Pallas kernel, forward + backward, full, T = 8192, H 128: share of the ceiling",
         0.45, at_least=True, percent=True, issue="issue 42", backend="tpu"),
    Goal("pallas_over_library", 17,
         "the best tuned library kernel's time over the Pallas kernel's, the least over every "
         "configuration with T ≥ 2048",
         1.0, at_least=True, percent=False, issue="issue 42", backend="tpu"),
)  # fmt: skip


def goal(key: str) -> Goal:
    """The goal named `key`; ValueError naming the known ones otherwise."""
    for g in GOALS:
        if g.key == key:
            return g
    raise ValueError(f"no goal {key!r}; the goals are {[g.key for g in GOALS]}")


def not_applicable(backend: str, g: Goal | None = None) -> str | None:
    """Why goal `g` (None: a goal set for the CPU) does not apply on `backend`, or None
    where it does."""
    where = "cpu" if g is None else g.backend
    if backend == where:
        return None
    return f"set for {APPLIES[where]}; this machine runs JAX on a {backend}"


def verdict(g: Goal, measured: float | None, backend: str) -> str:
    """The table's cell: "met", "missed by ...", "not applicable here: ..." or "not measured"."""
    why = not_applicable(backend, g)
    if why is not None:
        return f"not applicable here: {why}"
    if measured is None:
        return "not measured"
    if g.met(measured):
        return f"met ({g.show(measured)})"
    return f"missed by {g.show(g.shortfall(measured))} ({g.show(measured)})"


def page_sentence(g: Goal, measured: float | None, backend: str) -> str:
    """What a page says of its goal, visibly: the goal as set and what this build measured."""
    why = not_applicable(backend, g)
    head = f"The goal is {g.stated}"
    if why is not None:
        tail = f": not applicable here ({why})"
        if measured is not None:
            tail += f"; this build measured {g.show(measured)}"
        return head + tail + "."
    if measured is None:
        return f"{head}; this build did not measure it."
    if g.met(measured):
        return f"{head}; this build measured {g.show(measured)}: met."
    return (
        f"{head}; this build measured {g.show(measured)}: missed, by "
        f"{g.show(g.shortfall(measured))}."
    )


def machine_key(backend: str, device_kind: str, cpu_model: str, cpu_count: int) -> str:
    """A file name for one machine: backend, device (or CPU model) and core count."""
    name = cpu_model if backend == "cpu" else device_kind
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60] or "unknown"
    return f"{backend}-{slug}-{cpu_count}cores"


def bench_record(measured: dict, backend: str, facts: dict) -> dict:
    """What `make bench` writes for one machine: its facts, and per goal the value asked,
    the value measured and the verdict."""
    unknown = set(measured) - {g.key for g in GOALS}
    if unknown:
        raise ValueError(f"measured values for no goal: {sorted(unknown)}")
    goals = {}
    for g in GOALS:
        value = measured.get(g.key)
        goals[g.key] = {
            "chapter": g.chapter,
            "asked": g.stated,
            "measured": value,
            "verdict": verdict(g, value, backend),
            "missed": not_applicable(backend, g) is None and value is not None and not g.met(value),
        }
    return {"machine": facts, "backend": backend, "goals": goals}


def missed(record: dict) -> list[str]:
    """The goals a bench record missed on a machine they apply to."""
    return [key for key, row in record["goals"].items() if row["missed"]]


def write_record(record: dict, key: str, directory=BENCH_DIR) -> pathlib.Path:
    path = pathlib.Path(directory) / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def build_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get(BUILD_GOALS_ENV, _ROOT / "_build" / "goals"))


def note_measured(key: str, value: float, directory=None) -> None:
    """Leaves the value a chapter measured for goal `key` where build_info reads it."""
    goal(key)  # a ValueError for a key that names no goal
    folder = pathlib.Path(directory) if directory is not None else build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{key}.json").write_text(json.dumps({"measured": float(value)}))


def measured_in_build(directory=None) -> dict[str, float]:
    """The goal values the chapters of this build left (`note_measured`)."""
    folder = pathlib.Path(directory) if directory is not None else build_dir()
    return {
        path.stem: json.loads(path.read_text())["measured"]
        for path in sorted(folder.glob("*.json"))
        if path.stem in {g.key for g in GOALS}
    }


def recorded(directory=BENCH_DIR) -> dict[str, dict]:
    """Every machine's bench record under `directory`: {machine key: record}."""
    return {
        path.stem: json.loads(path.read_text())
        for path in sorted(pathlib.Path(directory).glob("*.json"))
    }


def device_measured(directory=_ROOT / "results") -> dict[str, dict]:
    """The goal values the chapters of each recorded device run left (scripts/device_run.py
    keeps each chapter's `note_measured` values in its entry of results/<backend>/run.json):
    {backend: {"device", "values": {key: value}, "dates": {key: date}}}."""
    runs = {}
    for path in sorted(pathlib.Path(directory).glob("*/run.json")):
        run = json.loads(path.read_text())
        values, dates = {}, {}
        for entry in run.get("chapters", {}).values():
            for key, value in entry.get("goals", {}).items():
                values[key], dates[key] = value, entry.get("date")
        if values:
            runs[run["backend"]] = {"device": run["device"], "values": values, "dates": dates}
    return runs


def goals_table(measured: dict, backend: str, records: dict[str, dict], devices=None) -> str:
    """Markdown: every goal, the value asked, where it applies, this build's verdict (from the
    values the chapters measured in this build, `measured`), each `make bench` record's, and
    each device run's (`device_measured`)."""
    header = "| Chapter | Goal | Asked | Applies to | This build |"
    for key, record in records.items():
        facts = record.get("machine", {})
        when = ", ".join(
            text
            for text in (
                facts.get("date"),
                facts.get("cores_free")
                and f"{facts['cores_free']} of {facts.get('cpu_count')} cores free",
            )
            if text
        )
        header += f" `make bench` on {key}" + (f" ({when})" if when else "") + " |"
    devices = devices or {}
    for device_backend, run in devices.items():
        header += f" device run on {run['device']} ({device_backend}) |"
    rule = "|" + " --- |" * (5 + len(records) + len(devices))
    rows = []
    for g in GOALS:
        row = f"| {g.chapter} | {g.what} | {g.stated} | {APPLIES[g.backend]} | "
        row += verdict(g, measured.get(g.key), backend) + " |"
        for record in records.values():
            cell = record.get("goals", {}).get(g.key)
            row += f" {cell['verdict'] if cell else 'not recorded'} |"
        for device_backend, run in devices.items():
            value = run["values"].get(g.key)
            if value is None:
                cell = "not recorded"
            elif not_applicable(device_backend, g):  # the value, without the long reason
                cell = f"not applicable ({g.show(value)})"
            else:
                cell = verdict(g, value, device_backend)
            row += f" {cell}" + (f", {run['dates'][g.key]}" if value is not None else "") + " |"
        rows.append(row)
    return "\n".join([header, rule, *rows])
