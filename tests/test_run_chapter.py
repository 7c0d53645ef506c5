"""scripts/run_chapter.py: the GPU run's book stage executes each chapter with it."""

import pathlib
import sys

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


def test_each_cell_reports_its_seconds_and_a_failing_cell_fails_the_chapter(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "book").mkdir()
    source = tmp_path / "book" / "99_a_chapter.md"
    source.write_text(CHAPTER)
    monkeypatch.setattr(run_chapter, "ROOT", tmp_path)
    assert run_chapter.main(["99", "--out", str(tmp_path / "out")]) == 1
    out, err = capsys.readouterr()
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("cell")] == [
        "cell 1"  # the first code cell ended; the second failed
    ]
    assert "x is not 2" in err
    source.write_text(CHAPTER.replace("x == 2", "x == 1"))
    assert run_chapter.main(["99", "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "99_a_chapter.ipynb").exists()


def test_keep_going_runs_past_a_failing_cell_and_reports_each_failure(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "book").mkdir()
    more = (
        "```{code-cell} python\ny = 3\n```\n\n"
        '```{code-cell} python\nassert y == 4, "y is not 4"\n```\n'
    )
    two_failures = CHAPTER + "\n" + more
    (tmp_path / "book" / "99_a_chapter.md").write_text(two_failures)
    monkeypatch.setattr(run_chapter, "ROOT", tmp_path)
    assert run_chapter.main(["99", "--out", str(tmp_path / "out"), "--keep-going"]) == 1
    out, err = capsys.readouterr()
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("cell")] == [
        "cell 1", "cell 2", "cell 3", "cell 4"
    ]  # fmt: skip
    failed = [line for line in err.splitlines() if line.startswith("FAILED cell")]
    assert failed == ["FAILED cell 2: AssertionError: x is not 2",
                      "FAILED cell 4: AssertionError: y is not 4"]  # fmt: skip
