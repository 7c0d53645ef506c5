"""scripts/gpu_run_tools.py and scripts/gpu_run.sh: the GPU run's plan, records and carry."""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_run_tools as tools  # noqa: E402 - scripts/ is put on the path just above


def test_each_limit_is_its_device_seconds_times_the_margin_rounded_up():
    for stage in tools.STAGES:
        limit = stage.device_seconds * tools.DEVICE_MARGIN
        assert stage.limit % 5 == 0 and limit <= stage.limit < limit + 5
    assert sum(tools.stage_limits().values()) <= tools.TOTAL_LIMIT == 540


def test_a_plan_over_9_minutes_is_refused(monkeypatch):
    slow = dataclasses.replace(tools.STAGES[2], device_seconds=1000)
    monkeypatch.setattr(tools, "STAGES", (*tools.STAGES[:2], slow, *tools.STAGES[3:]))
    with pytest.raises(ValueError, match="over the run's 540 s"):
        tools.stage_limits()


def test_the_readme_shows_the_stage_table_the_script_runs_by():
    assert tools.plan_table() in (ROOT / "README.md").read_text()


def test_the_stages_are_those_of_the_results_file_in_that_order():
    from jaxloops.measure import gpu_report

    assert [stage.name for stage in tools.STAGES] == list(gpu_report.STAGES)


def test_record_refuses_an_unknown_stage(tmp_path):
    with pytest.raises(ValueError, match="'bench' is not one of"):
        tools.record(tmp_path, "bench", "ok", 1.0, "")


def test_check_without_a_results_file_reports_it_instead_of_crashing(tmp_path, capsys):
    tools.record(tmp_path, "setup", "failed", 2.0, "JAX sees no GPU")
    assert tools.check(tmp_path) == 1
    out = capsys.readouterr().out
    assert "no " + str(tmp_path / "results.json") in out and "JAX sees no GPU" in out


def _results(tmp_path, **changes) -> dict:
    results = {key: {"x": 1} for key in tools.FILLED_SECTIONS}
    results["stages"] = {s.name: {"status": "ok", "seconds": 1.0} for s in tools.STAGES}
    results.update(changes)
    return results


def test_a_stand_in_run_must_fill_every_section_and_keep_every_stage_in_its_limit(tmp_path):
    assert tools.stand_in_problems(tmp_path, _results(tmp_path)) == []
    stages = _results(tmp_path)["stages"]
    stages["book"] = {"status": "ok", "seconds": tools.stage_limits(stand_in=True)["book"] + 1}
    stages["tests"] = {"status": "timeout", "seconds": 3.0}
    problems = tools.stand_in_problems(tmp_path, _results(tmp_path, lm={}, stages=stages))
    assert problems[0] == "section 'lm' is empty"
    assert "stage 'book' took" in problems[1] and "stage 'tests' is timeout" in problems[2]


def test_more_than_8_output_files_is_a_problem(tmp_path):
    for i in range(9):
        (tmp_path / f"f{i}").write_text("")
    (problem,) = tools.stand_in_problems(tmp_path, _results(tmp_path))
    assert problem.startswith("9 output files, over 8")


def test_wheels_of_packages_the_machine_has_are_skipped_unless_pinned():
    wheels = [pathlib.Path(n) for n in ("scikit_learn-1.9.1-cp312-x.whl",
              "myst_nb-1.4.0-py3-none-any.whl", "Sphinx_Book-1.0-py3-none-any.whl")]  # fmt: skip
    has = {"scikit_learn", "myst_nb"}
    assert [tools.distribution(w) for w in wheels] == ["scikit_learn", "myst_nb", "sphinx_book"]
    chosen = tools.select_wheels(wheels, is_installed=has.__contains__)
    assert chosen == wheels[1:]  # myst_nb is pinned; sphinx_book is missing here


def test_device_packages_and_unused_optional_wheels_are_dropped(tmp_path):
    for name in ("jaxlib-0.12-cp312.whl", "uvloop-0.23-cp312.whl", "sphinx-7.4.7-py3.whl"):
        (tmp_path / name).write_text("")
    assert tools.drop_device_wheels(tmp_path) == ["jaxlib-0.12-cp312.whl", "uvloop-0.23-cp312.whl"]
    assert [p.name for p in tmp_path.iterdir()] == ["sphinx-7.4.7-py3.whl"]


def test_the_carry_counts_the_tree_and_every_named_path_against_64_mib(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("ignored/\n.whl/\n")
    (tmp_path / "untracked.py").write_bytes(b"x" * 1000)
    (tmp_path / "ignored").mkdir()
    (tmp_path / "ignored" / "big").write_bytes(b"x" * 10**6)
    (tmp_path / ".whl").mkdir()
    (tmp_path / ".whl" / "a.whl").write_bytes(b"x" * 5000)
    sizes = tools.carry_bytes([tmp_path / ".whl"], root=tmp_path)
    assert sizes == {"tree": 1000 + len("ignored/\n.whl/\n"), str(tmp_path / ".whl"): 5000}
    limit = sum(sizes.values())
    assert tools.check_carry(sizes, limit=limit)[-1].endswith(": fits")
    assert tools.check_carry(sizes, limit=limit - 1)[-1].endswith("DOES NOT FIT")


def test_a_failed_build_is_reported_by_its_failing_cell():
    log = (
        "reading sources... [ 50%] book/06_device_loop\n\x1b[31mTraceback\x1b[0m\n"
        "An error occurred while executing the following cell:\n------------------\n"
        "check(ratio > 1.5, 'the scan is faster')\n------------------\n\n"
        "AssertionError: the scan is faster: 1.2\n"
        "\nThe above exception was the direct cause of the following exception:\n"
        "There was an error in building your book. Look above for the cause.\n"
    )
    cell = tools.failing_cell(log)
    assert cell.splitlines()[1] == "check(ratio > 1.5, 'the scan is faster')"
    assert cell.endswith("AssertionError: the scan is faster: 1.2")
    assert "error in building your book" not in cell
    assert tools.failing_cell("a\nb\nc", max_lines=2) == "b\nc"  # no cell: the log's end


def test_a_build_stopped_at_its_limit_names_the_chapter_it_was_executing():
    """The H200 run's book stage: chapter 1 executed, chapter 6 still running at 210 s."""
    log = (
        "/w/book/01_watching_jax.md: Executing notebook using local CWD [mystnb]\n"
        "/w/book/01_watching_jax.md: Executed notebook in 34.49 seconds [mystnb]\n"
        "/w/book/06_device_loop.md: Executing notebook using local CWD [mystnb]\n"
        "AssertionError\nThere was an error in building your book.\n"
    )
    found = tools.failing_cell(log).splitlines()[0]
    assert found == (
        "executed 01_watching_jax in 34.49 s; still executing 06_device_loop when the build stopped"
    )
    finished = log.replace("06_device_loop.md: Executing notebook using local CWD",
                           "06_device_loop.md: Executed notebook in 9 seconds")  # fmt: skip
    assert "still executing" not in tools.failing_cell(finished)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="with a GPU the run would measure")
def test_without_a_gpu_the_run_stops_after_setup_with_every_stage_recorded(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "SITE": str(tmp_path / "site")}
    run = subprocess.run(
        [str(ROOT / "scripts" / "gpu_run.sh"), str(tmp_path / "out")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, run.stdout + run.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["logs.tar.gz", "stages.json"]
    stages = json.loads((tmp_path / "out" / "stages.json").read_text())
    assert stages["setup"]["status"] == "failed" and "JAX sees no GPU" in stages["setup"]["detail"]
    assert {stages[n]["status"] for n in ("headline", "book", "tests", "sweeps")} == {"skipped"}
    assert "Traceback" not in run.stdout + run.stderr


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="a copy of the tree without git")
def test_the_default_output_folder_is_git_ignored():
    ignored = subprocess.run(["git", "check-ignore", "-q", "gpu-run/results.json"], cwd=ROOT)
    assert ignored.returncode == 0


def test_the_device_book_is_chapters_of_the_book_that_need_nothing_the_device_lacks():
    toc = (ROOT / "_toc.yml").read_text()
    for number in tools.GPU_BOOK_CHAPTERS:
        (page,) = sorted((ROOT / "book").glob(f"{number}_*.md"))
        assert f"file: book/{page.stem}" in toc
        # grain and flax are not on the device, and the carry has no room for them
        assert not re.search(r"\b(grain|flax|nnx_step|streaming)\b", page.read_text()), page
    assert len(set(tools.GPU_BOOK_CHAPTERS)) == len(tools.GPU_BOOK_CHAPTERS)


def _recorded(tmp_path, **facts):
    results = {
        "facts": {"device_kind": "NVIDIA H200", "jax": "0.11.2", "date": "then", **facts},
        "stages": {"setup": {"status": "ok"}, "book": {"status": "timeout"}},
        "tasks": {"ceiling f32": "done", "lm": "failed: OOM", "mlp 128": "crashed: SIGABRT"},
        "in_flight": "lm",
    }
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps(results))
    return path


def test_a_run_resumes_a_recorded_run_of_its_device_and_jax_only(tmp_path):
    recorded, out = _recorded(tmp_path), tmp_path / "out"
    said = tools.resume(recorded, out, "NVIDIA H200", "0.11.2")
    assert said.startswith("resuming") and "1 tasks done" in said
    started = json.loads((out / "results.json").read_text())
    assert started["tasks"] == {"ceiling f32": "done"}  # failed and crashed: tried again
    assert started["in_flight"] is None and len(started["resumed"]) == 1
    assert {s["status"] for s in started["stages"].values()} == {"pending"}
    for kind, jax_version in (("NVIDIA H100", "0.11.2"), ("NVIDIA H200", "0.12.0")):
        fresh = tmp_path / kind.replace(" ", "") / jax_version
        assert "a fresh run" in tools.resume(recorded, fresh, kind, jax_version)
        assert not (fresh / "results.json").exists()
    rehearsal = _recorded(tmp_path, rehearsal=True)
    assert "a fresh run" in tools.resume(rehearsal, tmp_path / "r", "NVIDIA H200", "0.11.2")
    assert "a fresh run" in tools.resume(tmp_path / "none.json", out, "NVIDIA H200", "0.11.2")


def test_the_book_stage_runs_unknown_chapters_first_and_passed_ones_last(tmp_path):
    out = tmp_path
    (out / "results.json").write_text(json.dumps({"facts": {}}))
    chapters = ("01", "06", "08", "09")
    assert tools.chapter_order(out / "results.json", chapters) == list(chapters)
    tools.record_chapter(out, "01_watching_jax", "ok", 34.49, "done")
    tools.record_chapter(out, "06_device_loop", "timeout", 175, "")
    tools.record_chapter(out, "09_kernels", "failed", 3, "AssertionError")
    assert tools.chapter_order(out / "results.json", chapters) == ["08", "09", "06", "01"]
    recorded = json.loads((out / "results.json").read_text())["book_chapters"]
    assert recorded["01_watching_jax"] == {"status": "ok", "seconds": 34.5, "detail": "done"}
    with pytest.raises(ValueError, match="'skipped'"):
        tools.record_chapter(out, "08_attention", "skipped", 0, "")
