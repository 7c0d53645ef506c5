"""scripts/run_chapter.py: `make chapter` and the device run execute chapters with it, in a
Jupyter kernel or in-process (scripts/in_process.py, for a machine with no TCP socket)."""

import pathlib
import sys

import pytest

from jaxloops import sharding

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import run_chapter  # noqa: E402 - scripts/ is put on the path just above

CHAPTER = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# A chapter

```{code-cell} python
x = 1
```

```{code-cell} python
assert x == 2, "x is not 2"
```
"""


NO_TCP = sharding.no_tcp_reason()
NEEDS_KERNEL = pytest.mark.skipif(
    bool(NO_TCP), reason=f"a Jupyter kernel talks to its client over TCP: {NO_TCP}"
)
KERNEL = pytest.param([], id="kernel", marks=NEEDS_KERNEL)
MODES = pytest.mark.parametrize("mode", [KERNEL, pytest.param(["--in-process"], id="in-process")])


@MODES
def test_each_cell_reports_its_seconds_and_a_failing_cell_fails_the_chapter(
    tmp_path, monkeypatch, capsys, mode
):
    (tmp_path / "book").mkdir()
    source = tmp_path / "book" / "99_a_chapter.md"
    source.write_text(CHAPTER)
    monkeypatch.setattr(run_chapter, "ROOT", tmp_path)
    assert run_chapter.main(["99", "--out", str(tmp_path / "out"), *mode]) == 1
    out, err = capsys.readouterr()
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("cell")] == [
        "cell 1"  # the first code cell ended; the second failed
    ]
    assert "x is not 2" in err
    source.write_text(CHAPTER.replace("x == 2", "x == 1"))
    assert run_chapter.main(["99", "--out", str(tmp_path / "out"), *mode]) == 0
    assert (tmp_path / "out" / "99_a_chapter.ipynb").exists()


@MODES
def test_keep_going_runs_past_a_failing_cell_and_reports_each_failure(
    tmp_path, monkeypatch, capsys, mode
):
    (tmp_path / "book").mkdir()
    more = (
        "```{code-cell} python\ny = 3\n```\n\n"
        '```{code-cell} python\nassert y == 4, "y is not 4"\n```\n'
    )
    two_failures = CHAPTER + "\n" + more
    (tmp_path / "book" / "99_a_chapter.md").write_text(two_failures)
    monkeypatch.setattr(run_chapter, "ROOT", tmp_path)
    assert run_chapter.main(["99", "--out", str(tmp_path / "out"), "--keep-going", *mode]) == 1
    out, err = capsys.readouterr()
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("cell")] == [
        "cell 1", "cell 2", "cell 3", "cell 4"
    ]  # fmt: skip
    # each failure on its cell's line as it ends: a run killed at its budget still says so
    logged = [line.split("  FAILED ")[-1] for line in out.splitlines() if "FAILED" in line]
    assert logged == ["AssertionError: x is not 2", "AssertionError: y is not 4"]
    failed = [line for line in err.splitlines() if line.startswith("FAILED cell")]
    assert failed == ["FAILED cell 2: AssertionError: x is not 2",
                      "FAILED cell 4: AssertionError: y is not 4"]  # fmt: skip


SHOWS = CHAPTER.replace('assert x == 2, "x is not 2"', "x = 2").replace(
    "x = 1",
    "from myst_nb import glue\nimport matplotlib.pyplot as plt\n"
    'x = 1\nprint("printed")\nglue("answer", 42)\nplt.plot([1, 2])\nx + 1',
)


@NEEDS_KERNEL
def test_in_process_records_what_a_kernel_records(tmp_path, monkeypatch):
    """Printed text, a glued value with its metadata, a figure and a cell's last value come
    out of the in-process run as out of nbclient's kernel: same outputs, same order."""
    pytest.importorskip("myst_nb", reason="the chapter glues with myst_nb, not installed here")
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "99_a_chapter.md").write_text(SHOWS)
    monkeypatch.setattr(run_chapter, "ROOT", tmp_path)
    monkeypatch.delenv("MPLBACKEND", raising=False)  # as `make chapter`: figures inline
    shapes = {}
    for mode in ([], ["--in-process"]):
        out = tmp_path / ("in-process" if mode else "kernel")
        assert run_chapter.main(["99", "--out", str(out), *mode]) == 0
        notebook = run_chapter.nbformat.read(out / "99_a_chapter.ipynb", as_version=4)
        shapes[bool(mode)] = [
            [(o.output_type, sorted(o.get("data", {})), o.get("metadata", {}).get("scrapbook"))
             for o in cell.outputs]
            for cell in notebook.cells if cell.cell_type == "code"
        ]  # fmt: skip
    assert shapes[True] == shapes[False]
    assert shapes[True][0] == [
        ("stream", [], None),
        ("display_data", ["text/plain"], {"name": "answer", "mime_prefix": ""}),
        ("execute_result", ["text/plain"], None),
        ("display_data", ["image/png", "text/plain"], None),
    ]


def test_a_cell_that_needs_tcp_is_skipped_with_its_reason_where_there_is_none(
    tmp_path, monkeypatch, capsys
):
    """In-process, a `needs-tcp` cell is not run on a machine without TCP (its output says
    why, and the chapter passes); with TCP it runs like any other (here: and fails)."""
    (tmp_path / "book").mkdir()
    fails = CHAPTER.replace(
        "```{code-cell} python\nassert", "```{code-cell} python\n:tags: [needs-tcp]\nassert"
    )
    (tmp_path / "book" / "99_a_chapter.md").write_text(fails)
    monkeypatch.setattr(run_chapter, "ROOT", tmp_path)
    out = ["--out", str(tmp_path / "out"), "--in-process"]
    monkeypatch.setattr(run_chapter.in_process, "no_tcp_reason", lambda: "no TCP (stand-in)")
    assert run_chapter.main(["99", *out]) == 0
    notebook = run_chapter.nbformat.read(tmp_path / "out" / "99_a_chapter.ipynb", as_version=4)
    assert "Not run on this machine: no TCP (stand-in)" in notebook.cells[-1].outputs[0].text
    monkeypatch.setattr(run_chapter.in_process, "no_tcp_reason", lambda: None)
    assert run_chapter.main(["99", *out]) == 1
