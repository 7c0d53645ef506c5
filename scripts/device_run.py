"""The book's run on whatever accelerator JAX finds (a TPU now, a GPU when one is lent).

On the device machine, in the repository's root, with .whl-device/ carried (the wheels that
its own package index lacks: `python3 scripts/device_run.py wheels` where there is network,
then the device tool's carry: [".whl-device"]):

    python3 scripts/device_run.py run "$OUT" [--stages setup,tests,chapters] [--budget 540]

Stages, each recorded in $OUT/run.json as it ends:
  setup     installs what the machine lacks, offline: from its own index (PIP_INDEX, when the
            folder exists) and the carried wheels, into SITE (kept on a warm machine)
  tests     the whole suite in ONE process (one process at a time can hold a TPU), with a
            JUnit report; the summary lists every skip with its reason
  kernels   chapter 17's kernel sweep (jaxloops.measure.kernel_sweep) in a process of its
            own, resumed from results/<device>/kernels.json: each row is written as it ends
  chapters  each chapter without a current record executed strictly, in a process of its
            own that holds the device (cells run in-process, scripts/in_process.py: the
            machine allows no TCP, so no Jupyter kernel); its notebook, seconds, failing
            cells and manifest (book/_ext/device_records.py) recorded as it ends, so a run
            stopped by its budget resumes in the next command
$OUT then holds run.json, notebooks.tar.gz (the executed chapters), junit.xml, tests.log,
chapters.log, chapters.jsonl, kernels.json and kernels.log: eight files, the most the device
tool returns. `record` merges a run into results/<device>/: that is what the book renders.

    python3 scripts/device_run.py record "$FILES_AT"
"""

import argparse
import datetime
import io
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import device_records  # noqa: E402 - book/_ext is put on the path just above

SITE = pathlib.Path(os.environ.get("SITE", "/tmp/jaxloops-site"))
WHEELS = ROOT / ".whl-device"
PIP_INDEX = pathlib.Path(os.environ.get("PIP_INDEX", "/opt/pypi/simple"))
# What the book and its tests import beyond JAX, numpy and pytest: from the machine's index.
FROM_INDEX = """optax==0.2.8 flax==0.12.8 orbax-checkpoint scikit-learn matplotlib nbformat ipython
nbclient ipykernel markdown-it-py mdit-py-plugins pyyaml docutils""".split()
# What that index lacks (read there on 2026-12-06), carried as wheels with no dependencies:
# orbax-checkpoint 0.12.8 (the index has 0.12.4) replaces the index's after it.
CARRIED = """grain==0.2.18 array-record==0.8.6 portpicker==1.6.0 jupytext==1.19.6 myst-nb==1.4.0
orbax-checkpoint==0.12.8""".split()
# Issue 41: each chapter should take <= 90 s on the chip (device_records.TARGET_SECONDS; the
# book marks a record over it). One that runs on is stopped at 240 s, its later cells recorded
# as not run, so that one chapter cannot spend a whole 10-minute command; at 150 s, chapters
# 11, 14 and 15 were stopped before their last sections and left nothing to measure them by.
CHAPTER_LIMIT = 240
# Chapters 11 and 14 compile 89 M-parameter programs, many of them: on the chip (2026-12-07)
# chapter 11 reached its last section at 240 s, before its cell 14 also trained at precision
# 'highest' (80 s now, was about 30); chapter 14 spent 181 s on its table of compiled searches
# (41 compiles) and was in its fourth-last cell at 450 s. They get a whole command each, on a
# machine already set up, over the 90 s target.
LONGER = {"11": 540, "14": 560}


def environment() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", JAXLOOPS_STRICT="1")
    path = [p for p in env.get("PYTHONPATH", "").split(":") if p]
    env["PYTHONPATH"] = ":".join([str(ROOT / "code"), *path, str(SITE)])  # the machine's JAX first
    env.pop("MPLBACKEND", None)  # figures reach the notebooks
    return env


def setup(out: pathlib.Path) -> dict:
    done = SITE / ".installed"
    if done.is_file():
        return {"status": "ok", "detail": "already installed on this machine"}
    pip = [sys.executable, "-m", "pip", "install", "--isolated", "-q", "--target", str(SITE)]
    env = dict(os.environ, PIP_CONFIG_FILE="/dev/null")
    if PIP_INDEX.is_dir():  # an index's tree, or a flat folder of wheels (the rehearsal's)
        flat = ["--no-index", "--find-links", str(PIP_INDEX)]
        index = flat if any(PIP_INDEX.glob("*.whl")) else ["--index-url", PIP_INDEX.as_uri()]
        subprocess.run([*pip, "--only-binary=:all:", *index, *FROM_INDEX], check=True, env=env)
    wheels = sorted(map(str, WHEELS.glob("*.whl")))
    if wheels:
        subprocess.run([*pip, "--no-index", "--no-deps", "--upgrade", *wheels], check=True, env=env)
    done.write_text("ok")
    return {"status": "ok", "detail": f"{len(wheels)} carried wheels"}


# Imports what the run needs and says what JAX found, in a process of its own: this driver
# never imports JAX, so it never holds the device while the tests or the chapters need it.
PROBE = """import json, jax, optax, flax, orbax.checkpoint, grain, jupytext, IPython, sklearn
import myst_nb.ext.glue  # the pages' glue: it needs docutils
d = jax.devices()[0]
found = {"device": d.device_kind, "backend": jax.default_backend(), "jax": jax.__version__}
print(json.dumps(found))"""


def describe() -> dict:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], env=environment(), capture_output=True, text=True
    )
    if probe.returncode != 0:
        raise RuntimeError(f"the environment does not import: {probe.stderr[-800:]}")
    return {**json.loads(probe.stdout.splitlines()[-1]), "date": datetime.date.today().isoformat()}


def _reason(element) -> str:
    """A JUnit failure's, error's or skip's reason: its message, or, for a module skipped at
    collection (message "collection skipped"), the reason pytest wrote in its text."""
    message = element.get("message") or ""
    if message == "collection skipped" and "Skipped: " in (element.text or ""):
        return element.text.split("Skipped: ", 1)[1].rstrip("')\" ")
    return message


def test_summary(junit: pathlib.Path) -> dict:
    """Counts, and each failure, error and skip with its reason, from a JUnit report."""
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    summary = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    summary["seconds"] = float(suite.get("time", 0))
    for kind in ("failure", "error", "skipped"):
        summary[f"{kind} list"] = sorted(
            f"{case.get('classname')}::{case.get('name')}: " + _reason(case.find(kind))[:300]
            for case in suite.iter("testcase")
            if case.find(kind) is not None
        )
    return summary


def tests(out: pathlib.Path, seconds: float, pytest_args: list[str]) -> dict:
    """The suite in one process. `-vv` (pyproject's addopts has -q) prints one line per test
    as it ends, so a run stopped by its budget still says what ran (`ended_tests`)."""
    junit, log = out / "junit.xml", out / "tests.log"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-vv", "-rs",
               f"--junitxml={junit}", "--durations=20", *pytest_args]  # fmt: skip
    code = logged(command, log, seconds)
    if code is None:
        return {"status": "timed out", "detail": f"after {seconds:.0f} s", **ended_tests(log)}
    summary = test_summary(junit) if junit.is_file() else {}
    ran = {"manifest": device_records.suite_manifest()}  # what was tested: stale when it changes
    return {"status": "ok" if code == 0 else f"exit {code}", **summary, **ran}


def ended_tests(log: pathlib.Path) -> dict:
    """From a verbose pytest log cut short: the tests that ended, by outcome."""
    ended = {}
    for line in log.read_text(errors="replace").splitlines():
        parts = line.split()
        if len(parts) >= 2 and "::" in parts[0] and parts[1] in OUTCOMES:
            ended.setdefault(f"{OUTCOMES[parts[1]]} list", []).append(parts[0])
    return {"ended": sum(map(len, ended.values())), **ended}


OUTCOMES = {"PASSED": "passed", "FAILED": "failure", "ERROR": "error", "SKIPPED": "skipped"}


def number(path: pathlib.Path) -> str:
    """A chapter's number as its file name gives it: "05", "08b"."""
    return path.stem.split("_")[0]


def chapters_to_run(recorded: dict, only: list[str]) -> list[pathlib.Path]:
    """The chapters without a current, passing record: in the order asked, else by number."""
    chapters = sorted((ROOT / "book").glob("[0-9][0-9]*_*.md"))
    if only:  # in the order given
        chapters = [p for n in only for p in chapters if number(p) == n]

    def fresh(p):
        entry = recorded.get(number(p), {})
        return entry.get("status") == "ok" and not device_records.changed(entry["manifest"])

    return [p for p in chapters if not fresh(p)]


def logged(command: list[str], log: pathlib.Path, seconds: float) -> int | None:
    """Runs `command` with the run's environment, its output appended to `log`; its exit
    status, or None when it ran past `seconds` and was killed."""
    with open(log, "a") as out:
        try:
            return subprocess.run(
                command,
                env=environment(),
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=seconds,
                cwd=ROOT,
            ).returncode
        except subprocess.TimeoutExpired:
            return None


# Why a chapter the run's budget cut off has no entry of its own: `record` keeps its earlier record
BUDGET_STOP = "killed at the run's budget"


def chapters(out: pathlib.Path, seconds: float, recorded: dict, only: list[str]) -> dict:
    """Each chapter in a process of its own, as the book build gives each a fresh kernel:
    chapter 12 sets the number of CPU devices before JAX starts, and a chapter's settings
    (warning filters, JAX's configuration) must not leak into the next one. On a TPU each
    process opens the chip again (10-15 s)."""
    todo, began, done = chapters_to_run(recorded, only), time.perf_counter(), []
    for path in todo:
        left = seconds - (time.perf_counter() - began)
        if left < 30:
            break
        limit = LONGER.get(number(path), CHAPTER_LIMIT)
        status = logged(
            [sys.executable, __file__, "execute", str(out), str(path), "--limit", str(limit)],
            out / "chapters.log",
            min(left, limit + 60),
        )
        progress = out / "chapters.jsonl"
        entries = (
            [json.loads(line) for line in progress.read_text().splitlines()]
            if progress.exists()
            else []
        )
        entry = next((e for e in entries if e["chapter"] == number(path)), None)
        if entry is None:  # killed at the budget, or the process died (a crash in XLA, say)
            why = BUDGET_STOP if status is None else f"the process died ({status})"
            entry = {
                "chapter": number(path),
                "stem": path.stem,
                "status": "stopped",
                "failures": [{"index": None, "error": why}],
                "seconds": None,
                "date": datetime.date.today().isoformat(),
                "manifest": device_records.manifest(path),
            }
        done.append(entry)
        pack(out)  # at once: a command killed at the device's limit still brings it back
    return {"status": "ok", "detail": f"{len(done)} of {len(todo)} chapters", "chapters": done}


def pack(out: pathlib.Path) -> None:
    """Moves the executed notebooks into notebooks.tar.gz, beside those packed before, and drops
    goals/ (each chapter's values are in its entry): the device tool returns at most 8 files, and
    on 2026-12-07 a run killed at the session's limit, before it packed, lost chapter 17's
    notebook to the goals' files (`files_left_out`)."""
    shutil.rmtree(out / "goals", ignore_errors=True)
    packed, folder = out / "notebooks.tar.gz", out / "notebooks"
    notebooks = {}
    if packed.is_file():
        with tarfile.open(packed) as tar:
            notebooks = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    for path in sorted(folder.glob("*.ipynb")) if folder.is_dir() else ():
        notebooks[f"notebooks/{path.name}"] = path.read_bytes()
    if not notebooks:
        return
    with tarfile.open(packed.with_suffix(".part"), "w:gz") as tar:
        for name, data in notebooks.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    packed.with_suffix(".part").replace(packed)  # whole or not at all
    shutil.rmtree(folder, ignore_errors=True)


def execute(out: pathlib.Path, paths: list[str], limit: float) -> None:
    """Each chapter in turn, its cells run in this process, written as soon as it ends."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import nbformat

    import run_chapter
    from in_process import cell_line
    from in_process import execute as run_cells
    from jaxloops.pages import goals

    (out / "notebooks").mkdir(exist_ok=True)
    for path in map(pathlib.Path, paths):
        print(f"== {path.name}", flush=True)
        began, notebook = time.perf_counter(), run_chapter.read_chapter(path)
        noted = out / "goals" / path.stem  # where this chapter's `goals.note_measured` writes
        os.environ[goals.BUILD_GOALS_ENV] = str(noted)
        report = lambda *cell: print(cell_line(*cell), file=sys.__stdout__, flush=True)
        failures = run_cells(notebook, path.parent, keep_going=True, on_cell=report, limit=limit)
        seconds = time.perf_counter() - began
        nbformat.write(notebook, out / "notebooks" / f"{path.stem}.ipynb")
        entry = {
            "chapter": number(path),
            "stem": path.stem,
            "seconds": round(seconds, 1),
            "status": "failed" if failures else "ok",
            "failures": [
                {"index": f.index, "error": f"{f.ename}: {f.evalue}"[:500]} for f in failures
            ],
            "date": datetime.date.today().isoformat(),
            "manifest": device_records.manifest(path),
            "goals": goals.measured_in_build(noted) if noted.is_dir() else {},
        }
        with open(out / "chapters.jsonl", "a") as progress:
            progress.write(json.dumps(entry) + "\n")


def kernels(out: pathlib.Path, seconds: float, backend: str) -> dict:
    """Chapter 17's sweep, resumed from the recorded rows (the sweep re-runs a row whose
    kernel source changed), in a child process that holds the device; its tiny `--quick`
    sizes, interpreted, anywhere but on a TPU (the CPU rehearsal)."""
    rows, recorded = out / "kernels.json", ROOT / "results" / backend / "kernels.json"
    if recorded.is_file() and not rows.is_file():
        shutil.copy(recorded, rows)
    command = [sys.executable, "-m", "jaxloops.measure.kernel_sweep", str(rows)]
    command += [] if backend == "tpu" else ["--quick"]  # the kernels are for a TPU
    code = logged([*command, "--budget", f"{seconds - 20:.0f}"], out / "kernels.log", seconds)
    status = "ok" if code == 0 else "timed out" if code is None else f"exit {code}"
    return {"status": status, "detail": f"rows in {rows.name}"}


def run(
    out: pathlib.Path,
    stages: list[str],
    budget: float,
    only: list[str],
    pytest_args: list[str] = (),
    tests_budget: float = float("inf"),
) -> int:
    start, record = time.perf_counter(), {"stages": {}}
    out.mkdir(parents=True, exist_ok=True)
    left = lambda: budget - (time.perf_counter() - start)
    for stage in stages:
        began = time.perf_counter()
        try:
            if stage != "setup" and "backend" not in record:
                record.update(describe())
            if stage == "setup":
                result = setup(out)
            elif stage == "tests":
                result = tests(out, min(left(), tests_budget) - 5, list(pytest_args))
            elif stage == "kernels":
                result = kernels(out, left() - 5, record["backend"])
            elif stage == "chapters":
                recorded = device_records.load_run(record.get("backend", "tpu"))
                result = chapters(out, left() - 5, recorded.get("chapters", {}), only)
            else:
                raise ValueError(f"unknown stage {stage!r}: setup, tests, kernels or chapters")
        except Exception as error:  # recorded, and the next stage still runs
            result = {"status": "error", "detail": repr(error)[:800]}
        record["stages"][stage] = {**result, "seconds": round(time.perf_counter() - began, 1)}
        (out / "run.json").write_text(json.dumps(record, indent=1))
    pack(out)
    return 0 if all(r["status"] == "ok" for r in record["stages"].values()) else 1


def record_run(files_at: pathlib.Path) -> None:
    """Merges a device run's files into results/<backend>/: the chapters it ran replace their
    records (notebook and entry; a chapter whose process died brought no notebook, and an
    earlier run's is removed, not shown as its outputs); the rest stay, and so does the record
    of a chapter the run's budget stopped before it ended (it says nothing of the chapter)."""
    new = json.loads((files_at / "run.json").read_text())
    if new["backend"] == "cpu":  # the CPU's figures come from the build and `make bench`
        raise ValueError(
            f"the run at {files_at} found backend {new['backend']!r} ({new.get('device')}): JAX "
            "did not see the accelerator (a PYTHONPATH set afresh hides the machine's JAX: "
            "book/tpu.md); not recorded"
        )
    target = ROOT / "results" / new["backend"]
    target.mkdir(parents=True, exist_ok=True)
    merged = device_records.load_run(new["backend"]) or {"chapters": {}}
    merged.update({k: new[k] for k in ("device", "backend", "jax")})
    ran = new["stages"].get("chapters", {}).get("chapters", [])
    brought = set()  # the notebooks this run brought back
    if (files_at / "notebooks.tar.gz").is_file():
        with tarfile.open(files_at / "notebooks.tar.gz") as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.endswith(".ipynb"):
                    name = pathlib.Path(member.name).name
                    notebook = json.loads(tar.extractfile(member).read())
                    entry = next((e for e in ran if f"{e['stem']}.ipynb" == name), {})
                    # Provenance beside the outputs (which are never touched): where, when, and
                    # the SHA-256 of the sources the notebook ran
                    notebook.setdefault("metadata", {})["device_run"] = {
                        **{k: new[k] for k in ("device", "backend", "jax", "date")},
                        "source_hash": entry.get("manifest", {}),
                    }
                    (target / name).write_text(json.dumps(notebook, indent=1) + "\n")
                    brought.add(name)
    for entry in ran:
        cut = [f["error"] for f in entry.get("failures", [])] == [BUDGET_STOP]
        if not (cut and entry["chapter"] in merged["chapters"]):
            merged["chapters"][entry["chapter"]] = entry
            if f"{entry['stem']}.ipynb" not in brought:  # died before writing one: an earlier
                (target / f"{entry['stem']}.ipynb").unlink(missing_ok=True)  # run's is not its
    if (files_at / "kernels.json").is_file():  # chapter 17's rows, each with its provenance
        shutil.copy(files_at / "kernels.json", target / "kernels.json")
    if "tests" in new["stages"]:  # a whole run's summary, or what ended before its budget
        merged["tests"] = {**new["stages"]["tests"], "date": new["date"]}
    (target / "run.json").write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")


def download_wheels() -> None:
    """CARRIED into .whl-device/ (needs the network): wheels for the device's Python 3.11."""
    shutil.rmtree(WHEELS, ignore_errors=True)
    platforms = [f"--platform=manylinux_{n}_x86_64" for n in ("2_28", "2_27", "2_24", "2_17")]
    download = "-m pip download -q --no-deps --only-binary=:all: --python-version 3.11"
    command = [sys.executable, *download.split(), "--implementation=cp", *platforms]
    subprocess.run([*command, "-d", str(WHEELS), *CARRIED], check=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="verb", required=True)
    go = sub.add_parser("run")
    go.add_argument("out", type=pathlib.Path)
    go.add_argument("--stages", default="setup,tests,chapters")
    go.add_argument("--budget", type=float, default=540, help="seconds for the whole run")
    go.add_argument("--chapters", default="", help="e.g. 01,02 (default: every chapter)")
    go.add_argument("--tests-budget", type=float, default=float("inf"), help="seconds at most")
    go.add_argument("--pytest-args", default="", help='e.g. "tests/test_x.py -x" (default: all)')
    ex = sub.add_parser("execute")
    ex.add_argument("out", type=pathlib.Path)
    ex.add_argument("paths", nargs="*")
    ex.add_argument("--limit", type=float, default=CHAPTER_LIMIT)
    sub.add_parser("wheels")
    rec = sub.add_parser("record")
    rec.add_argument("files_at", type=pathlib.Path)
    args = parser.parse_args(argv)
    if args.verb == "execute":
        execute(args.out, args.paths, args.limit)
        return 0
    if args.verb == "wheels":
        download_wheels()
        return 0
    if args.verb == "record":
        record_run(args.files_at)
        return 0
    only = [c if len(c) > 1 else c.zfill(2) for c in args.chapters.split(",") if c]
    pytest_args = shlex.split(args.pytest_args)
    return run(args.out, args.stages.split(","), args.budget, only, pytest_args, args.tests_budget)


if __name__ == "__main__":
    sys.exit(main())
