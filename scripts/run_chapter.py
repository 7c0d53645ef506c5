"""Executes one chapter of the book in the terminal and writes the executed notebook.

Usage: python scripts/run_chapter.py 05 [--out _build/chapters] [--in-process]

The chapter (book/05_*.md, MyST Markdown) is read with jupytext, executed with nbclient in
this Python's kernel, cell by cell (each cell's seconds printed as it ends), and written as
.ipynb; a failing cell stops it with the cell's error. `--in-process` runs the cells in this
process with IPython's shell instead of a kernel (scripts/in_process.py): for a machine that
allows no TCP socket, where a kernel cannot start.
"""

import argparse
import os
import pathlib
import sys
import time

import jupytext
import nbformat

import in_process

ROOT = pathlib.Path(__file__).resolve().parents[1]


def find_chapter(number: str) -> pathlib.Path:
    matches = sorted((ROOT / "book").glob(f"{number}_*.md"))
    if len(matches) != 1:
        names = ", ".join(p.name for p in sorted((ROOT / "book").glob("[0-9][0-9]*_*.md")))
        raise SystemExit(f"no single chapter numbered {number!r} in book/; chapters: {names}")
    return matches[0]


def read_chapter(source: pathlib.Path):
    notebook = jupytext.read(source)
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return notebook


def execute_with_kernel(notebook, cwd, timeout, keep_going, on_cell):
    """As `in_process.execute`, in a Jupyter kernel started by nbclient."""
    import nbclient

    client = nbclient.NotebookClient(
        notebook, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": cwd}}
    )
    failures = []
    with client.setup_kernel(env=dict(os.environ)):
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type != "code":
                continue
            began, failure = time.perf_counter(), None
            try:
                client.execute_cell(cell, index)
            except nbclient.exceptions.CellExecutionError as error:
                failure = in_process.CellError(index, error.ename, error.evalue)
                failures.append(failure)
                if not keep_going:
                    print(error, file=sys.stderr)  # the whole traceback
                    break
            on_cell(index, time.perf_counter() - began, failure)
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("number", help="the chapter's two-digit number, e.g. 05")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "_build" / "chapters")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="run every cell after a failing one too, and report each failure (the GPU run's "
        "book stage: one session then learns all of a chapter's failing cells); still exit 1",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the cells in this process (IPython's shell), not in a Jupyter kernel",
    )
    args = parser.parse_args(argv)
    source = find_chapter(args.number.zfill(2))
    notebook = read_chapter(source)
    start = time.perf_counter()
    print(f"executing {source.relative_to(ROOT)} ...", flush=True)
    # one line per cell as it ends: a chapter stopped at a time limit shows where its time went
    report = lambda *cell: print(in_process.cell_line(*cell), flush=True)
    if args.in_process:
        failures = in_process.execute(notebook, source.parent, args.keep_going, report)
    else:
        failures = execute_with_kernel(
            notebook, str(source.parent), args.timeout, args.keep_going, report
        )
    for failure in failures:
        print(
            f"FAILED cell {failure.index}: {failure.ename}: {failure.evalue}"[:600], file=sys.stderr
        )
    if failures:
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / (source.stem + ".ipynb")
    nbformat.write(notebook, target)
    print(f"done in {time.perf_counter() - start:.1f} s: {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
