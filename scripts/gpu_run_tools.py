"""The GPU run's plumbing, none of it needing JAX: the stage plan and its limits, each stage's
record, the final check, the carry, the wheels, and a failed book build's cell.

Usage (scripts/gpu_run.sh and scripts/fetch_wheels.sh call these):
  python scripts/gpu_run_tools.py limits [--stand-in]     # "STAGE LIMIT" lines, and "total N"
  python scripts/gpu_run_tools.py plan-table              # the stage table the README shows
  python scripts/gpu_run_tools.py record --out DIR STAGE STATUS SECONDS [--detail TEXT]
  python scripts/gpu_run_tools.py check DIR [--stand-in]  # every problem; exit 1 if any
  python scripts/gpu_run_tools.py wheels DIR --drop-device-packages | --select
  python scripts/gpu_run_tools.py carry PATH...           # tree + PATHs against 64 MiB
  python scripts/gpu_run_tools.py failing-cell LOG        # a failed book build's cell
  python scripts/gpu_run_tools.py resume RECORDED OUT --device-kind K --jax V
  python scripts/gpu_run_tools.py chapter-order RESULTS    # the book stage's chapters, in order
  python scripts/gpu_run_tools.py record-chapter --out DIR CHAPTER STATUS SECONDS [--detail T]
"""

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import math
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
CARRY_LIMIT_BYTES = 64 * 2**20  # the device tool carries at most 64 MiB: tree + named paths
MAX_OUTPUT_FILES = 8  # the device tool hands back at most 8 files from its output folder
TOTAL_LIMIT = 540  # 9 minutes: room for the final check inside the device's 10-minute command
DEVICE_MARGIN = 1.2  # every device limit: its estimate x this, for what the estimate misses
STAND_IN_MARGIN = 3  # a stand-in stage may take its measured CPU time x this: a busy CPU passes


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of scripts/gpu_run.sh and how its device limit is planned."""

    name: str
    runs: str
    cpu_seconds: float  # measured on this project's 2-core CPU (where: `measured`)
    measured: str
    device_seconds: float  # what the stage needs on the device (how known: `device_measured`)
    device_measured: str

    @property
    def limit(self) -> int:
        """Seconds the stage gets on the device: device_seconds x DEVICE_MARGIN, rounded up
        to 5 s."""
        return 5 * math.ceil(self.device_seconds * DEVICE_MARGIN / 5)

    @property
    def stand_in_limit(self) -> int:
        """Seconds the stage gets where the CPU stands in for the GPU (CI's rehearsal)."""
        return 5 * math.ceil(self.cpu_seconds * STAND_IN_MARGIN / 5)


# Most valuable first. The CPU seconds of setup, headline and sweeps are .ci/rehearse_device's on
# this project's 2-core machine while four other sessions loaded it (load average 9 to 16), so
# they are high; the book's is stop 30's quiet build (the GPU_BOOK_CHAPTERS cells, the
# appendix and the pages, plus Sphinx); the tests' is CI's rehearsal at stop 29 (the suite
# under Python 3.12, 2 workers).
# The device seconds are the first GPU run's (one H200, 2026-12-04, results/gpu/results.json),
# where every stage but setup ran out of its planned limit: its benchmark tasks took 0.3 to
# 27 s each (an MLP row's compile and GEMM autotuning dominate it), chapter 6 alone ran past
# 175 s, and the tests reached 85 % in 105 s on 8 workers. No session's 15 device minutes hold
# the whole run, so it resumes: on the same kind of device and JAX, a committed
# results/gpu/results.json is the starting point, its done tasks are not measured again, and
# each stage does what is left inside its limit; the book stage executes the chapters in turn,
# those never run first, and records each.
# The chapters the device's book stage executes: those whose figures a GPU changes (the loop's
# throughput, attention and its kernels, decoding, the transformer's step, memory at GPU
# sizes). Chapters 2-5 and 7 show the same on any backend, 12-13 run on CPU devices by design,
# and 15-16 need grain, which the device lacks and the 64 MiB carry has no room for.
GPU_BOOK_CHAPTERS = ("01", "06", "08", "09", "10", "11", "14")

STAGES = (
    Stage("setup", "JAX sees the GPU; the build tools from .whl/ (pip --no-index)",
          34.4, "rehearsal 1, 96 wheels installed", 16, "H200 run: 15.8 s, 67 wheels"),
    Stage("headline", "implementation report, ceilings, cuDNN sweep, MLP rows, LM MFU, bf16 step",
          41.4, "rehearsal 2, toy plan", 120,
          "H200 run: 114 s for the tasks before the LM step, which ran past 40 s"),
    Stage("book", "each chapter whose figures a GPU changes, executed strictly in turn",
          246, "make book, those chapters' cells at CPU sizes, stop 30", 150,
          "H200 run: chapter 1 in 34.5 s, chapter 6 past 175 s"),
    Stage("tests", "the test suite, 16 workers, one line per test as it ends",
          172.5, "CI's rehearsal, stop 29: -n 2, Python 3.12", 100,
          "H200 run: 85 % in 105 s on 8 workers"),
    Stage("sweeps", "the rest of the attention sweep, the causal sweep, the plot",
          18.0, "rehearsal 2, toy plan", 50,
          "H200 run: 39 points in about 125 s; 3 points and the plot are left"),
)  # fmt: skip


def stage_limits(stand_in: bool = False) -> dict[str, int]:
    """Each stage's limit in seconds; raises ValueError if the device plan's sum is over 540."""
    total = sum(stage.limit for stage in STAGES)
    if total > TOTAL_LIMIT:
        raise ValueError(f"the stage limits add up to {total} s, over the run's {TOTAL_LIMIT} s")
    return {s.name: s.stand_in_limit if stand_in else s.limit for s in STAGES}


def plan_table() -> str:
    """The README's table of the stages, their measured CPU time, GPU factor and limit."""
    lines = [
        "| stage | runs | CPU seconds (measured by) | device seconds (known from) "
        f"| device limit (x {DEVICE_MARGIN:g}) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in STAGES:
        lines.append(
            f"| {s.name} | {s.runs} | {s.cpu_seconds:g} ({s.measured}) "
            f"| {s.device_seconds:g} ({s.device_measured}) | {s.limit} s |"
        )
    total = sum(s.limit for s in STAGES)
    lines.append(f"| whole run | | | | {total} s of {TOTAL_LIMIT} s |")
    return "\n".join(lines)


# --- the record of each stage and the final check ----------------------------------------


def write_json(path: pathlib.Path, data) -> None:
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data, indent=1, default=float))
    partial.replace(path)  # atomic: a killed stage never leaves half a file


def record(out: pathlib.Path, stage: str, status: str, seconds: float, detail: str) -> None:
    """Records a stage's outcome in OUT/stages.json and, where it exists, OUT/results.json."""
    names = [s.name for s in STAGES]
    if stage not in names:
        raise ValueError(f"stage {stage!r} is not one of {names}")
    path = out / "stages.json"
    stages = json.loads(path.read_text()) if path.exists() else {}
    stages[stage] = {"status": status, "seconds": round(seconds, 1), "detail": detail[-2000:]}
    write_json(path, stages)
    results = out / "results.json"
    if results.exists():
        data = json.loads(results.read_text())
        data["stages"].update(stages)
        write_json(results, data)


def record_chapter(
    out: pathlib.Path, chapter: str, status: str, seconds: float, detail: str
) -> None:
    """Records one chapter's strict execution in OUT/results.json's "book_chapters" (made if
    the file has none); the file must exist (the headline stage writes it)."""
    if status not in ("ok", "failed", "timeout"):
        raise ValueError(f"chapter status {status!r}; expected 'ok', 'failed' or 'timeout'")
    path = out / "results.json"
    data = json.loads(path.read_text())
    data.setdefault("book_chapters", {})[chapter] = {
        "status": status, "seconds": round(seconds, 1), "detail": detail[-2000:]}  # fmt: skip
    write_json(path, data)


CHAPTER_ORDER = {None: 0, "failed": 1, "timeout": 2, "ok": 3}


def chapter_order(results_path: pathlib.Path, chapters=GPU_BOOK_CHAPTERS) -> list[str]:
    """The chapters in the order the book stage executes them: those with no record first,
    then those that failed, then those that ran out of time, then those that passed, each
    group in the book's order (so a run that resumes spends its time where nothing is known)."""
    data = json.loads(results_path.read_text()) if results_path.exists() else {}
    done = data.get("book_chapters", {})
    status = {c: next((r["status"] for n, r in done.items() if n.startswith(c)), None)
              for c in chapters}  # fmt: skip
    return sorted(chapters, key=lambda c: CHAPTER_ORDER[status[c]])


def resume(recorded: pathlib.Path, out: pathlib.Path, device_kind: str, jax_version: str) -> str:
    """Starts OUT/results.json from a recorded run of the same device kind and JAX version,
    its tasks that did not finish (failed, crashed) forgotten so they are tried again, its
    stages pending; says what it did. A recorded file of another device or JAX is left alone."""
    if not recorded.exists():
        return f"no {recorded}: a fresh run"
    data = json.loads(recorded.read_text())
    facts = data.get("facts", {})
    if facts.get("rehearsal") or (facts.get("device_kind"), facts.get("jax")) != (
        device_kind, jax_version):  # fmt: skip
        was = f"{facts.get('device_kind')}, JAX {facts.get('jax')}"
        return f"{recorded} is from {was}, not {device_kind}, JAX {jax_version}: a fresh run"
    data["tasks"] = {t: v for t, v in data.get("tasks", {}).items() if v == "done"}
    data["in_flight"] = None
    data["stages"] = {name: {"status": "pending"} for name in data.get("stages", {})}
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    data.setdefault("resumed", []).append(started)  # facts["date"] stays the first run's
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", data)
    return f"resuming {recorded}: {len(data['tasks'])} tasks done, {facts.get('date')}"


# The sections a complete run fills (gpu_report.RESULT_SECTIONS and the LM step's), and the
# bookkeeping of its tasks.
FILLED_SECTIONS = ("facts", "plan", "stages", "implementations", "ceilings", "bandwidth",
                   "attention", "causal", "mlp", "lm", "tasks")  # fmt: skip


BUSY_CPU_NOISE = ("ceilings row ", "attention row ")  # gpu_report.check_run's sample floor


def stand_in_problems(out: pathlib.Path, results: dict) -> list[str]:
    """What a stand-in rehearsal must also show: every section filled, every stage ok inside
    its stand-in limit, and at most 8 output files."""
    limits = stage_limits(stand_in=True)
    problems = [f"section {key!r} is empty" for key in FILLED_SECTIONS if not results.get(key)]
    for name, stage in results["stages"].items():
        if stage["status"] != "ok":
            problems.append(f"stage {name!r} is {stage['status']}, not ok")
        elif stage["seconds"] > limits[name]:
            problems.append(f"stage {name!r} took {stage['seconds']} s of {limits[name]} s")
    files = sorted(p.name for p in out.rglob("*") if p.is_file())
    if len(files) > MAX_OUTPUT_FILES:
        problems.append(f"{len(files)} output files, over {MAX_OUTPUT_FILES}: {files}")
    return problems


def check(out: pathlib.Path, stand_in: bool = False) -> int:
    """Prints each stage, the goals and every problem of the run in OUT; 1 if any problem."""
    path, stages_path = out / "results.json", out / "stages.json"
    stages = json.loads(stages_path.read_text()) if stages_path.exists() else {}
    limits = stage_limits(stand_in)
    for name, stage in stages.items():
        took = f"{stage['seconds']:6} s of {limits[name]:3} s"
        print(f"stage {name:6} {stage['status']:8} {took}  {stage['detail']}")
    if not path.exists():
        print(f"PROBLEM: no {path}: no stage measured anything (see the stages above)")
        return 1
    results = json.loads(path.read_text())
    try:
        from jaxloops.measure import gpu_report
    except Exception as error:  # noqa: BLE001 - a broken install is a problem to report
        print(f"PROBLEM: jaxloops.measure does not import: {type(error).__name__}: {error}")
        return 1
    problems = gpu_report.check_run(results)
    mfu = results.get("lm", {}).get("mfu_of_measured_f32")
    if mfu is not None and mfu > 1 and not results["facts"].get("rehearsal"):
        problems.append(f"the LM step ran at {mfu:.2f} of the measured f32 ceiling: a bad ceiling")
    if not results["facts"].get("rehearsal"):
        try:
            for row in gpu_report.goals(results):
                print(f"goal: {row['goal']}: {row['measured']} (met: {row['met']})")
        except Exception as error:  # noqa: BLE001 - a run too incomplete to judge
            problems.append(f"the goals cannot be judged: {type(error).__name__}: {error}")
    if stand_in:
        # A sample under the timing floor is a busy CPU's noise, not the pipeline's fault.
        noise = [p for p in problems if p.startswith(BUSY_CPU_NOISE)]
        problems = [p for p in problems if p not in noise] + stand_in_problems(out, results)
        print("".join(f"note (stand-in, not a problem here): {p}\n" for p in noise), end="")
    for problem in problems:
        print("PROBLEM:", problem)
    print(f"{path}: {len(problems)} problem(s)")
    return 1 if problems else 0


# --- what is carried to the device -----------------------------------------------------------

# What the device's Python 3.12 has: JAX 0.11 with its CUDA 13 plugin, optax, numpy, matplotlib,
# scikit-learn, pytest, and what pip installs with them (as requirements-device.txt installs
# them for .ci/rehearse_device). fetch_wheels.sh drops these wheels.
DEVICE_PACKAGES = frozenset(
    "jax jaxlib jax_cuda13_plugin jax_cuda13_pjrt optax absl_py numpy scipy ml_dtypes "
    "opt_einsum matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing "
    "python_dateutil packaging narwhals scikit_learn joblib threadpoolctl pytest iniconfig "
    "pluggy pygments tzdata cloudpickle".split()
)
# Optional imports of what is carried, never used by a build or a test: dropped for space.
UNUSED_OPTIONAL = frozenset({"uvloop", "debugpy", "jedi", "parso"})
# Installed even where the device has the package: the book's configuration (_config.yml's
# extensions and nb_* options) is tested with exactly these versions of the build tools.
PINNED = frozenset({"jupyter_book", "myst_nb"})


def distribution(wheel: pathlib.Path) -> str:
    """The normalised distribution name of a wheel file: "scikit_learn" for scikit_learn-1.9..."""
    return re.sub(r"[-_.]+", "_", wheel.name.split("-")[0]).lower()


def installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def select_wheels(wheels: list[pathlib.Path], is_installed=installed) -> list[pathlib.Path]:
    """The wheels to install: those whose package this Python lacks, and the pinned ones.

    A wheel of a package the machine has would shadow it (pip --target, then PYTHONPATH).
    """
    return [w for w in wheels if distribution(w) in PINNED or not is_installed(distribution(w))]


def drop_device_wheels(folder: pathlib.Path) -> list[str]:
    """Deletes the wheels of DEVICE_PACKAGES and UNUSED_OPTIONAL from `folder`; their names."""
    dropped = []
    for wheel in sorted(folder.glob("*.whl")):
        if distribution(wheel) in DEVICE_PACKAGES | UNUSED_OPTIONAL:
            wheel.unlink()
            dropped.append(wheel.name)
    return dropped


def tree_files(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """What the device tool carries without being asked: tracked and untracked-not-ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, check=True,
    ).stdout  # fmt: skip
    return [root / name for name in listed.decode().split("\0") if name]


def carry_bytes(paths: list[pathlib.Path], root: pathlib.Path = ROOT) -> dict[str, int]:
    """Bytes of the tree and of each named path (a file or a folder), as the tool counts them."""
    sizes = {"tree": sum(p.stat().st_size for p in tree_files(root) if p.is_file())}
    for path in paths:
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        if not path.exists():
            raise ValueError(f"{path} does not exist: nothing to carry")
        sizes[str(path)] = sum(p.stat().st_size for p in files)
    return sizes


def check_carry(sizes: dict[str, int], limit: int = CARRY_LIMIT_BYTES) -> list[str]:
    """One line per part and the total; the last line says whether it fits in `limit`."""
    lines = [f"{name}: {size / 2**20:.1f} MiB" for name, size in sizes.items()]
    total = sum(sizes.values())
    verdict = "fits" if total <= limit else "DOES NOT FIT"
    lines.append(f"carry: {total / 2**20:.1f} MiB of {limit / 2**20:.0f} MiB: {verdict}")
    return lines


# --- a failed book build ---------------------------------------------------------------------

CELL_ERROR = re.compile(
    r"An error occurred while executing the following cell:\n(.*?)"
    r"(?:\nException occurred|\nThe above exception|\Z)",
    re.S,
)


EXECUTING = re.compile(r"book/(\w+)\.md: Execut(?:ing notebook|ed notebook in ([\d.]+) seconds)")


def chapters_executed(text: str) -> str:
    """Which chapters a book build executed, with their seconds, and the one it was still
    executing when it stopped (a build stopped at its time limit fails no cell)."""
    done, started = {}, []
    for name, seconds in EXECUTING.findall(text):
        if seconds:
            done[name] = float(seconds)
        else:
            started.append(name)
    parts = [f"executed {', '.join(f'{n} in {s:g} s' for n, s in done.items()) or 'none'}"]
    unfinished = [n for n in started if n not in done]
    if unfinished:
        parts.append(f"still executing {unfinished[-1]} when the build stopped")
    return "; ".join(parts)


def failing_cell(log: str, max_lines: int = 80) -> str:
    """The first failing cell and its error from a book build's log; else which chapters it
    executed (and in how long), or, where it executed none, its last lines."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", log)
    blocks = CELL_ERROR.findall(text)
    if not blocks and EXECUTING.search(text):
        return chapters_executed(text)
    lines = blocks[0].strip("\n").splitlines() if blocks else text.splitlines()[-max_lines:]
    if len(lines) > max_lines:
        lines = lines[:20] + ["[...]"] + lines[-(max_lines - 21) :]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("limits").add_argument("--stand-in", action="store_true")
    commands.add_parser("plan-table")
    commands.add_parser("book-chapters")
    rec = commands.add_parser("record")
    rec.add_argument("--out", required=True, type=pathlib.Path)
    for name, kind in (("stage", str), ("status", str), ("seconds", float)):
        rec.add_argument(name, type=kind)
    rec.add_argument("--detail", default="")
    chk = commands.add_parser("check")
    chk.add_argument("out", type=pathlib.Path)
    chk.add_argument("--stand-in", action="store_true")
    whl = commands.add_parser("wheels")
    whl.add_argument("folder", type=pathlib.Path)
    whl.add_argument("--drop-device-packages", action="store_true")
    commands.add_parser("carry").add_argument("paths", nargs="*", type=pathlib.Path)
    commands.add_parser("failing-cell").add_argument("log", type=pathlib.Path)
    chap = commands.add_parser("record-chapter")
    chap.add_argument("--out", required=True, type=pathlib.Path)
    for name, kind in (("chapter", str), ("status", str), ("seconds", float)):
        chap.add_argument(name, type=kind)
    chap.add_argument("--detail", default="")
    commands.add_parser("chapter-order").add_argument("results", type=pathlib.Path)
    res = commands.add_parser("resume")
    for name in ("recorded", "out"):
        res.add_argument(name, type=pathlib.Path)
    res.add_argument("--device-kind", required=True)
    res.add_argument("--jax", required=True)
    args = parser.parse_args(argv)
    return COMMANDS[args.command](args)


def _limits(args) -> int:
    limits = stage_limits(args.stand_in)
    print("\n".join(f"{name} {limit}" for name, limit in limits.items()))
    print(f"total {sum(limits.values()) if args.stand_in else TOTAL_LIMIT}")
    return 0


def _record(args) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    record(args.out, args.stage, args.status, args.seconds, args.detail)
    return 0


def _wheels(args) -> int:
    if args.drop_device_packages:
        for name in drop_device_wheels(args.folder):
            print(f"dropped {name}: on the device already, or never imported", file=sys.stderr)
        return 0
    print("\n".join(str(w) for w in select_wheels(sorted(args.folder.glob("*.whl")))))
    return 0


def _carry(args) -> int:
    lines = check_carry(carry_bytes(args.paths))
    print("\n".join(lines))
    return 0 if lines[-1].endswith(": fits") else 1


COMMANDS = {
    "limits": _limits,
    "plan-table": lambda args: print(plan_table()) or 0,
    "book-chapters": lambda args: print(" ".join(GPU_BOOK_CHAPTERS)) or 0,
    "record": _record,
    "check": lambda args: check(args.out, args.stand_in),
    "wheels": _wheels,
    "carry": _carry,
    "failing-cell": lambda args: print(failing_cell(args.log.read_text(errors="replace"))) or 0,
    "record-chapter": lambda args: (
        record_chapter(args.out, args.chapter, args.status, args.seconds, args.detail) or 0
    ),
    "chapter-order": lambda args: print(" ".join(chapter_order(args.results))) or 0,
    "resume": lambda args: print(resume(args.recorded, args.out, args.device_kind, args.jax)) or 0,
}

if __name__ == "__main__":
    sys.exit(main())
