"""scripts/device_run.py and book/_ext/device_records.py: the device run's resumption, its
records, and the manifests that say when a record is stale."""

import json
import pathlib
import sys
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "book" / "_ext"))

import device_records  # noqa: E402 - book/_ext is put on the path just above

import device_run  # noqa: E402

CHAPTER = """# A chapter

Some prose.

```{code-cell} python
:tags: [remove-input]
import jaxloops.sizes
```

```{code-cell} python
x = 1
```
"""


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A repository of two chapters and a three-module package, as device_records sees it."""
    (tmp_path / "book").mkdir()
    package = tmp_path / "code" / "jaxloops"
    (package / "measure").mkdir(parents=True)
    (package / "__init__.py").write_text("from jaxloops import data\n")
    (package / "data.py").write_text("X = 1\n")
    (package / "sizes.py").write_text("def f():\n    from .measure import timing\n")
    (package / "measure" / "__init__.py").write_text("")
    (package / "measure" / "timing.py").write_text("T = 1\n")
    (package / "unused.py").write_text("U = 1\n")
    (tmp_path / "book" / "02_two.md").write_text(CHAPTER)
    (tmp_path / "book" / "03_three.md").write_text(CHAPTER.replace("x = 1", "y = 2"))
    monkeypatch.setattr(device_records, "ROOT", tmp_path)
    monkeypatch.setattr(device_records, "PACKAGE", package)
    monkeypatch.setattr(device_records, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(device_run, "ROOT", tmp_path)
    return tmp_path


def test_the_manifest_holds_the_code_and_every_module_it_uses(tree):
    """Imports inside functions and relative imports count; a module nobody imports does not,
    nor one that a package's `__init__` only re-exports."""
    files = set(device_records.manifest(tree / "book" / "02_two.md"))
    assert files == {
        "book/02_two.md",
        "code/jaxloops/sizes.py",
        "code/jaxloops/measure/timing.py",
    }


def test_a_name_imported_through_a_package_counts_the_module_that_defines_it(tree):
    package = tree / "code" / "jaxloops"
    (package / "__init__.py").write_text(
        "from jaxloops import data\nfrom jaxloops.data import X as Y\n"
        "from jaxloops.unused import U\nimport importlib\n"
        "def __getattr__(name):\n    return importlib.import_module('jaxloops.lazy')\n"
    )
    (package / "lazy.py").write_text("Z = 1\n")
    (package / "measure" / "__init__.py").write_text("from jaxloops.measure.timing import T\n")
    chapter = tree / "book" / "04_four.md"
    cases = {
        "from jaxloops import Y": {"code/jaxloops/data.py"},
        "from jaxloops import measure\nmeasure.T": {"code/jaxloops/measure/timing.py"},
        "import jaxloops.measure as m\nm.timing.T": {"code/jaxloops/measure/timing.py"},
        # a name the package's own code provides: its __init__, and what it names
        "import jaxloops\njaxloops.Z": {"code/jaxloops/__init__.py", "code/jaxloops/lazy.py"},
        'import subprocess\nsubprocess.run(["python", "-m", "jaxloops.unused"])': {
            "code/jaxloops/unused.py"
        },
    }
    for code, expected in cases.items():
        chapter.write_text(f"```{{code-cell}} python\n{code}\n```\n")
        assert set(device_records.manifest(chapter)) - {"book/04_four.md"} == expected, code


def test_a_record_goes_stale_when_its_code_or_a_module_changes_not_its_prose(tree):
    chapter = tree / "book" / "02_two.md"
    recorded = device_records.manifest(chapter)
    assert device_records.changed(recorded) == []
    chapter.write_text(CHAPTER.replace("Some prose.", "Other prose."))
    assert device_records.changed(recorded) == []  # prose: the run would compute the same
    (tree / "code" / "jaxloops" / "unused.py").write_text("U = 2\n")
    assert device_records.changed(recorded) == []  # a module the chapter does not import
    (tree / "code" / "jaxloops" / "measure" / "timing.py").write_text("T = 2\n")
    assert device_records.changed(recorded) == ["code/jaxloops/measure/timing.py"]
    chapter.write_text(CHAPTER.replace("x = 1", "x = 2"))
    assert device_records.changed(recorded) == ["book/02_two.md", "code/jaxloops/measure/timing.py"]
    # a record that hashed more than the chapter uses today (an older, coarser manifest) is
    # judged on what it uses
    chapter.write_text(CHAPTER)
    current = {**device_records.manifest(chapter), "code/jaxloops/unused.py": "0" * 64}
    assert device_records.changed(current) == []
    del current["code/jaxloops/sizes.py"]  # one it uses that the record did not hash
    assert device_records.changed(current) == ["code/jaxloops/sizes.py"]


def test_a_run_resumes_with_the_chapters_that_have_no_current_passing_record(tree):
    two, three = tree / "book" / "02_two.md", tree / "book" / "03_three.md"
    assert device_run.chapters_to_run({}, []) == [two, three]
    assert device_run.chapters_to_run({}, ["03", "02"]) == [three, two]  # the order asked
    recorded = {"02": {"status": "ok", "manifest": device_records.manifest(two)},
                "03": {"status": "failed", "manifest": device_records.manifest(three)}}  # fmt: skip
    assert device_run.chapters_to_run(recorded, []) == [three]  # a failed one runs again
    two.write_text(CHAPTER.replace("x = 1", "x = 3"))
    assert device_run.chapters_to_run(recorded, []) == [two, three]  # a stale one too


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1"
failures="1" skipped="1" tests="4" time="12.5"><testcase classname="tests.test_a" name="test_ok"/>
<testcase classname="tests.test_a" name="test_bad"><failure message="assert 1 == 2">x</failure>
</testcase><testcase classname="tests.test_b" name="test_err"><error message="boom">y</error>
</testcase><testcase classname="tests.test_b" name="test_skip"><skipped message="needs TCP"/>
</testcase><testcase classname="" name="tests.test_c">
<skipped message="collection skipped">('/t.py', 1, 'Skipped: torch for make bench')</skipped>
</testcase>
</testsuite></testsuites>"""


def test_the_test_summary_lists_each_failure_error_and_skip_with_its_reason(tmp_path):
    (tmp_path / "junit.xml").write_text(JUNIT)
    summary = device_run.test_summary(tmp_path / "junit.xml")
    assert {k: summary[k] for k in ("tests", "failures", "errors", "skipped")} == {
        "tests": 4,
        "failures": 1,
        "errors": 1,
        "skipped": 1,
    }  # fmt: skip (the suite's counts)
    assert summary["failure list"] == ["tests.test_a::test_bad: assert 1 == 2"]
    assert summary["error list"] == ["tests.test_b::test_err: boom"]
    assert summary["skipped list"] == [  # a module skipped at collection: its reason, not pytest's
        "::tests.test_c: torch for make bench",
        "tests.test_b::test_skip: needs TCP",
    ]


def test_recording_a_run_replaces_the_chapters_it_ran_and_keeps_the_rest(tree):
    def device_files(folder, chapters):
        folder.mkdir()
        entries = [{"chapter": c, "stem": f"{c}_x", "status": "ok", "manifest": {}}
                   for c in chapters]  # fmt: skip
        run = {"device": "TPU v5 lite", "backend": "tpu", "jax": "0.10.2", "date": "2026-12-06",
               "stages": {"chapters": {"status": "ok", "chapters": entries}}}  # fmt: skip
        (folder / "run.json").write_text(json.dumps(run))
        (folder / "notebooks").mkdir()
        for c in chapters:
            (folder / "notebooks" / f"{c}_x.ipynb").write_text(json.dumps({"run": str(folder)}))
        with tarfile.open(folder / "notebooks.tar.gz", "w:gz") as tar:
            tar.add(folder / "notebooks", arcname="notebooks")
        return folder

    device_run.record_run(device_files(tree / "first", ["02", "03"]))
    device_run.record_run(device_files(tree / "second", ["03"]))
    merged = json.loads((tree / "results" / "tpu" / "run.json").read_text())
    assert sorted(merged["chapters"]) == ["02", "03"] and merged["device"] == "TPU v5 lite"
    notebook = lambda c: json.loads((tree / "results" / "tpu" / f"{c}_x.ipynb").read_text())
    assert notebook("02")["run"].endswith("first") and notebook("03")["run"].endswith("second")
    # A chapter the run's budget stopped keeps its earlier record; one whose process died
    # (a crash in XLA, say) is recorded so, and a budget stop with no earlier record is kept.
    third = device_files(tree / "third", [])
    run = json.loads((third / "run.json").read_text())

    def stopped(c, why):
        failures = [{"index": None, "error": why}]
        return {"chapter": c, "stem": f"{c}_x", "status": "stopped", "failures": failures}

    run["stages"]["chapters"]["chapters"] = [
        stopped("02", device_run.BUDGET_STOP), stopped("03", "the process died (-11)"),
        stopped("04", device_run.BUDGET_STOP)]  # fmt: skip
    (third / "run.json").write_text(json.dumps(run))
    device_run.record_run(third)
    merged = json.loads((tree / "results" / "tpu" / "run.json").read_text())
    assert merged["chapters"]["02"]["status"] == "ok"
    assert merged["chapters"]["03"]["status"] == "stopped"
    assert merged["chapters"]["04"]["status"] == "stopped"
    # The died chapter's earlier notebook is gone (it is not this run's); the budget stop's stays
    assert not (tree / "results" / "tpu" / "03_x.ipynb").exists()
    assert notebook("02")["run"].endswith("first")


def test_each_chapter_s_notebook_is_packed_as_it_ends_beside_the_earlier_ones(tmp_path):
    # A command killed at the device's limit brings back what is in $OUT: the notebooks must
    # already be in the one tar, and no goals/ files may take the tool's 8 slots
    for name in ("07_x", "17_x"):
        (tmp_path / "notebooks").mkdir()
        (tmp_path / "notebooks" / f"{name}.ipynb").write_text(name)
        (tmp_path / "goals" / name).mkdir(parents=True)
        (tmp_path / "goals" / name / "g.json").write_text("{}")
        device_run.pack(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notebooks.tar.gz"]
    with tarfile.open(tmp_path / "notebooks.tar.gz") as tar:
        held = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()}
    assert held == {"notebooks/07_x.ipynb": "07_x", "notebooks/17_x.ipynb": "17_x"}
    device_run.pack(tmp_path)  # nothing new: the tar stays as it was
    with tarfile.open(tmp_path / "notebooks.tar.gz") as tar:
        assert len(tar.getmembers()) == 2


def test_a_run_that_found_only_the_cpu_is_refused_not_recorded(tree):
    # One chip run (2026-12-07) found a plain JAX before the machine's and ran on its CPU
    (tree / "fell_back").mkdir()
    run = {"device": "cpu", "backend": "cpu", "jax": "0.10.2", "date": "2026-12-07", "stages": {}}
    (tree / "fell_back" / "run.json").write_text(json.dumps(run))
    with pytest.raises(ValueError, match="found backend 'cpu'"):
        device_run.record_run(tree / "fell_back")
    assert not (tree / "results").exists()


def test_a_test_run_cut_short_still_says_which_tests_ended(tmp_path):
    (tmp_path / "tests.log").write_text(
        "tests/test_a.py::test_one PASSED [ 10%]\n"
        "tests/test_a.py::test_two FAILED [ 20%]\n"
        "tests/test_b.py::test_three[7] SKIPPED (needs TCP) [ 30%]\n"
        "tests/test_b.py::test_four \n"  # in flight when the run was stopped
    )
    ended = device_run.ended_tests(tmp_path / "tests.log")
    assert ended == {"ended": 3, "passed list": ["tests/test_a.py::test_one"],
                     "failure list": ["tests/test_a.py::test_two"],
                     "skipped list": ["tests/test_b.py::test_three[7]"]}  # fmt: skip


def test_the_kernel_sweep_resumes_from_the_recorded_rows_and_is_recorded_back(tree, monkeypatch):
    recorded = tree / "results" / "tpu" / "kernels.json"
    recorded.parent.mkdir(parents=True)
    recorded.write_text('{"rows": ["done before"]}')
    calls = []
    monkeypatch.setattr(device_run, "logged", lambda command, log, seconds: calls.append(command))
    out = tree / "out"
    out.mkdir()
    result = device_run.kernels(out, 300, "tpu")
    # The child starts from the recorded rows, and its budget leaves it time to write them.
    assert (out / "kernels.json").read_text() == recorded.read_text()
    assert calls[0][-4:] == [
        "jaxloops.measure.kernel_sweep",
        str(out / "kernels.json"),
        "--budget",
        "280",
    ]
    assert result["status"] == "timed out"  # the stub returned None, as a killed child does
    device_run.kernels(out, 300, "cpu")  # anywhere else: the tiny sizes, interpreted
    assert "--quick" in calls[1] and "--quick" not in calls[0]
    (out / "kernels.json").write_text('{"rows": ["done before", "done now"]}')
    (out / "run.json").write_text(json.dumps({"device": "TPU v5 lite", "backend": "tpu",
                                              "jax": "0.10.2", "date": "2026-12-07",
                                              "stages": {}}))  # fmt: skip
    device_run.record_run(out)
    assert json.loads(recorded.read_text())["rows"] == ["done before", "done now"]


def test_an_unknown_stage_is_recorded_as_an_error_naming_it(tree, monkeypatch):
    monkeypatch.setattr(device_run, "describe", lambda: {"backend": "cpu"})
    assert device_run.run(tree / "out", ["kernel"], budget=60, only=[]) == 1
    stage = json.loads((tree / "out" / "run.json").read_text())["stages"]["kernel"]
    assert stage["status"] == "error" and "unknown stage 'kernel'" in stage["detail"]


def test_a_record_over_the_chapter_target_says_so():
    assert device_records._seconds(42.4) == "42"
    target = device_records.TARGET_SECONDS
    assert device_records._seconds(95.2) == f"95 (over the {target} s target)"
    assert device_records._seconds(None) == ""


def test_a_module_s_comments_and_docstrings_do_not_stale_a_record(tree):
    chapter = tree / "book" / "02_two.md"
    timing = tree / "code" / "jaxloops" / "measure" / "timing.py"
    timing.write_text('"""Timing."""\n\ndef f():\n    """Doc."""\n    return 1  # one\n')
    recorded = device_records.manifest(chapter)
    timing.write_text('"""Timing, again."""\n\n\ndef f():\n    """Other."""\n    return 1\n')
    assert device_records.changed(recorded) == []
    timing.write_text('"""Timing."""\n\ndef f():\n    """Doc."""\n    return 2  # one\n')
    assert device_records.changed(recorded) == ["code/jaxloops/measure/timing.py"]


def test_a_suite_record_is_stale_when_a_test_or_package_file_changes(tree):
    (tree / "tests").mkdir()
    (tree / "tests" / "test_a.py").write_text("def test_a():\n    assert True\n")
    recorded = device_records.suite_manifest()
    assert "tests/test_a.py" in recorded and "code/jaxloops/unused.py" in recorded
    assert device_records.suite_changed(recorded) == []
    # a docstring is not what runs; an assertion is
    (tree / "tests" / "test_a.py").write_text('def test_a():\n    """Doc."""\n    assert True\n')
    assert device_records.suite_changed(recorded) == []
    (tree / "tests" / "test_a.py").write_text("def test_a():\n    assert False\n")
    assert device_records.suite_changed(recorded) == ["tests/test_a.py"]
    (tree / "code" / "jaxloops" / "new.py").write_text("N = 1\n")  # a new file the run lacked
    assert "code/jaxloops/new.py" in device_records.suite_changed(recorded)


def test_a_records_glued_sentences_are_read_back_as_text_and_a_missing_one_is_named():
    def glued(name, plain):
        meta = {"scrapbook": {"name": name, "mime_prefix": "application/papermill.record/"}}
        data = {"application/papermill.record/text/plain": plain}
        return {"output_type": "display_data", "metadata": meta, "data": data}

    sentence = glued("ch_sentence", "'Attention fell: 46.7 to 13.8 ms.'")  # a string's repr
    notebook = {"cells": [
        {"cell_type": "code", "outputs": [sentence]},
        {"cell_type": "code", "outputs": [
            {"output_type": "stream", "name": "stdout", "text": "printed, not glued\n"},
            glued("ch_share", "0.649"),
        ]},
    ]}  # fmt: skip
    values = device_records.glued_values(notebook, ["ch_share", "ch_sentence"])
    assert values == [("ch_share", "0.649"), ("ch_sentence", "Attention fell: 46.7 to 13.8 ms.")]
    with pytest.raises(ValueError, match="ch_what_changed"):
        device_records.glued_values(notebook, ["ch_sentence", "ch_what_changed"])


def _glued_output(name, plain):
    meta = {"scrapbook": {"name": name, "mime_prefix": "application/papermill.record/"}}
    data = {"application/papermill.record/text/plain": plain}
    return {"output_type": "display_data", "metadata": meta, "data": data}


def test_the_chip_role_formats_a_recorded_value_and_says_when_it_is_stale_or_missing():
    notebook = {"cells": [{"cell_type": "code", "outputs": [
        _glued_output("ratio", "2.9137"), _glued_output("words", "'fits in memory'"),
    ]}]}  # fmt: skip
    assert device_records.chip_text(notebook, "ratio", ".2f", stale=False) == "2.91"
    assert device_records.chip_text(notebook, "ratio", "", stale=False) == "2.9137"
    assert device_records.chip_text(notebook, "words", "", stale=False) == "fits in memory"
    assert device_records.chip_text(notebook, "ratio", ".1f", stale=True) == "2.9 (stale record)"
    assert device_records.chip_text(notebook, "absent", ".1f", stale=False) == "not yet recorded"
    assert device_records.chip_text(None, "ratio", ".1f", stale=False) == "not yet recorded"
    with pytest.raises(ValueError, match="words"):  # a number's format on a sentence
        device_records.chip_text(notebook, "words", ".2f", stale=False)


def test_a_records_cells_are_labelled_by_the_section_they_follow():
    notebook = {"cells": [
        {"cell_type": "code", "source": "import jax", "outputs": []},
        {"cell_type": "markdown", "source": "# 6. Title\n\n## Fetching the loss\ntext"},
        {"cell_type": "code", "source": "x = 1", "outputs": []},
        {"cell_type": "markdown", "source": "### A subsection\n## Scanning an epoch"},
        {"cell_type": "code", "source": "y = 2", "outputs": []},
    ]}  # fmt: skip
    sections = device_records.cell_sections(notebook)
    assert sections == ["Opening", "Fetching the loss", "Fetching the loss", "Scanning an epoch",
                        "Scanning an epoch"]  # fmt: skip


def test_a_script_a_chapter_runs_by_path_is_in_its_manifest():
    chapter = device_records.ROOT / "book" / "07_evaluation.md"
    assert "code/examples/whole_loop.py" in device_records.manifest(chapter)
    found = device_records.scripts_run('x = run("../code/examples/whole_loop.py")', chapter.parent)
    assert [p.name for p in found] == ["whole_loop.py"]
    assert device_records.scripts_run('x = run("../nowhere.py")', chapter.parent) == []
