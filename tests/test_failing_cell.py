""".ci/failing_cell.py: CI's report of a failed book build."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / ".ci"))

from failing_cell import failing_cell  # noqa: E402 - .ci/ is put on the path just above

FAILED = (
    "reading sources... [ 50%] book/06_device_loop\n\x1b[31mTraceback\x1b[0m\n"
    "An error occurred while executing the following cell:\n------------------\n"
    "check(ratio > 1.5, 'the scan is faster')\n------------------\n\n"
    "AssertionError: the scan is faster: 1.2\n"
    "\nThe above exception was the direct cause of the following exception:\n"
    "There was an error in building your book. Look above for the cause.\n"
)


def test_a_failed_build_is_reported_by_its_failing_cell():
    cell = failing_cell(FAILED)
    assert cell.splitlines()[1] == "check(ratio > 1.5, 'the scan is faster')"
    assert cell.endswith("AssertionError: the scan is faster: 1.2")
    assert "error in building your book" not in cell
    assert failing_cell("a\nb\nc", max_lines=2) == "b\nc"  # no cell: the log's end


def test_a_build_stopped_at_its_limit_names_the_chapter_it_was_executing():
    """The H200 run's book stage: chapter 1 executed, chapter 6 still running at 210 s."""
    log = (
        "/w/book/01_watching_jax.md: Executing notebook using local CWD [mystnb]\n"
        "/w/book/01_watching_jax.md: Executed notebook in 34.49 seconds [mystnb]\n"
        "/w/book/06_device_loop.md: Executing notebook using local CWD [mystnb]\n"
        "AssertionError\nThere was an error in building your book.\n"
    )
    found = failing_cell(log).splitlines()[0]
    assert found == (
        "executed 01_watching_jax in 34.49 s; still executing 06_device_loop when the build stopped"
    )
    finished = log.replace("06_device_loop.md: Executing notebook using local CWD",
                           "06_device_loop.md: Executed notebook in 9 seconds")  # fmt: skip
    assert "still executing" not in failing_cell(finished)


def test_the_command_ci_runs_prints_the_cell(tmp_path):
    """.ci/run calls the script on _build/book.log; that call is checked as written there."""
    assert "python3 .ci/failing_cell.py _build/book.log" in (ROOT / ".ci" / "run").read_text()
    (tmp_path / "book.log").write_text(FAILED)
    script = ROOT / ".ci" / "failing_cell.py"
    printed = subprocess.run(
        [sys.executable, script, tmp_path / "book.log"], capture_output=True, text=True
    )
    assert printed.stdout.strip() == failing_cell(FAILED)
