"""Executes a notebook's cells in this Python process, with no Jupyter kernel.

A kernel started by nbclient talks to its client over ZeroMQ sockets, and on a machine that
allows no TCP socket (the lent TPU machine: not even on the loopback) it cannot start. Here
IPython's own shell runs each cell in this process instead, and what the cell shows is
recorded as a kernel would record it: printed text as `stream` outputs, `display(...)` (and
so myst_nb's `glue`) as `display_data` with its metadata, a cell's last value as
`execute_result`, matplotlib figures (the inline backend, as in a kernel) as PNG
`display_data`, and an exception as an `error` output. The notebook written from it renders
in Jupyter and in the book as an nbclient-executed one does.

One process runs one chapter at a time (`execute`); each chapter gets a fresh shell and
namespace (`InteractiveShell.clear_instance()`), but the process (JAX, the device it holds,
compiled programs in memory) is shared, which saves opening the chip for every chapter.
"""

import base64
import contextlib
import io
import os
import signal
import sys
import time

import nbformat
from IPython.core.displayhook import DisplayHook
from IPython.core.displaypub import DisplayPublisher
from IPython.core.interactiveshell import InteractiveShell
from matplotlib_inline import backend_inline


class _Outputs:
    """The outputs of the cell being executed."""

    def __init__(self):
        self.cell = None

    def add(self, output):
        if self.cell is not None:
            self.cell.outputs.append(output)

    def stream(self, name: str, text: str):
        if self.cell is None or not text:
            return
        last = self.cell.outputs[-1] if self.cell.outputs else None
        if last is not None and last.output_type == "stream" and last.name == name:
            last.text += text
        else:
            self.add(nbformat.v4.new_output("stream", name=name, text=text))


OUTPUTS = _Outputs()


def _jsonable(data: dict) -> dict:
    """Binary MIME data (PNG, JPEG) as base64 text, as a kernel sends it."""
    return {
        mime: base64.b64encode(value).decode() if isinstance(value, bytes) else value
        for mime, value in data.items()
    }


class _Publisher(DisplayPublisher):
    def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **_):
        sys.stdout.flush()
        OUTPUTS.add(
            nbformat.v4.new_output("display_data", data=_jsonable(data), metadata=metadata or {})
        )

    def clear_output(self, wait=False):
        if OUTPUTS.cell is not None:
            OUTPUTS.cell.outputs = []


class _DisplayHook(DisplayHook):
    def write_output_prompt(self):
        pass

    def write_format_data(self, format_dict, md_dict=None):
        OUTPUTS.add(
            nbformat.v4.new_output(
                "execute_result",
                data=_jsonable(format_dict),
                metadata=md_dict or {},
                execution_count=self.shell.execution_count,
            )
        )

    def finish_displayhook(self):
        sys.stdout.flush()


class _Shell(InteractiveShell):
    def enable_gui(self, gui=None):
        pass  # the inline backend needs no event loop

    def _showtraceback(self, etype, evalue, stb):
        OUTPUTS.add(
            nbformat.v4.new_output(
                "error", ename=etype.__name__, evalue=str(evalue), traceback=list(stb)
            )
        )


class _Stream(io.TextIOBase):
    """sys.stdout or sys.stderr while a cell runs: into the cell's outputs."""

    def __init__(self, name: str, echo):
        self.name, self.echo = name, echo

    def writable(self):
        return True

    def write(self, text):
        OUTPUTS.stream(self.name, text)
        return len(text)

    def flush(self):
        self.echo.flush()


def no_tcp_reason() -> str | None:
    """Why a cell tagged `needs-tcp` cannot run here, or None: the package's own test
    (`jaxloops.sharding.no_tcp_reason`), on which chapter 12's processes rely."""
    from jaxloops.sharding import no_tcp_reason as reason

    return reason()


class CellError(Exception):
    """A cell raised: its index, exception name and value."""

    def __init__(self, index: int, ename: str, evalue: str):
        super().__init__(f"cell {index}: {ename}: {evalue}")
        self.index, self.ename, self.evalue = index, ename, evalue


class OverTimeLimit(Exception):
    pass


def _over_time(signum, frame):
    raise OverTimeLimit("the chapter ran past its time limit")


def _fresh_shell():
    """A new IPython shell whose displays land in `OUTPUTS`, figures inline, none open."""
    _Shell.clear_instance()
    shell = _Shell.instance(display_pub_class=_Publisher, displayhook_class=_DisplayHook)
    # Figures shown at the end of each cell, as in a kernel. matplotlib_inline sets up the PNG
    # format once per process, on the first shell: each chapter's fresh shell needs it again.
    backend_inline.configure_inline_support.current_backend = "unset"
    backend_inline.InlineBackend.clear_instance()
    shell.enable_matplotlib("inline")
    # A fresh kernel has no figure open; a figure left open here (by the process's earlier
    # work) would take the chapter's first plot, and no new figure would be shown.
    sys.modules["matplotlib.pyplot"].close("all")
    return shell


def cell_line(index: int, seconds: float, failure=None) -> str:
    """One log line per cell as it ends, its failure on the same line: a run killed at its
    budget before the notebook is written still says which checks failed."""
    failed = f"  FAILED {failure.ename}: {failure.evalue}"[:400] if failure else ""
    return f"cell {index}: {seconds:.1f} s{failed}"


def execute(notebook, cwd, keep_going=False, on_cell=None, limit=None):
    """Runs `notebook`'s code cells in order, in this process, filling in their outputs.

    A cell tagged `needs-tcp` (processes joined by jax.distributed) is not run where
    `no_tcp_reason()` gives a reason: its only output then says so, and it is no failure.

    Args:
      notebook: an nbformat notebook (e.g. `jupytext.read(...)`); changed in place.
      cwd: the directory the cells run in (a chapter's folder, as the book build does).
      keep_going: run the cells after a failing one too.
      on_cell: called as `on_cell(index, seconds, failure)` after each code cell, `failure`
        its `CellError` or None (`cell_line` writes the three as a log line).
      limit: seconds for the whole notebook, or None. Past it the running cell is interrupted
        (at its next Python instruction: not inside one compiled call) and fails, and no
        later cell runs.
    Returns:
      The list of `CellError`s (empty when every cell ran); without `keep_going`, at most one.
    """
    shell = _fresh_shell()
    failures, previous = [], os.getcwd()
    os.chdir(cwd)
    streams = _Stream("stdout", sys.stdout), _Stream("stderr", sys.stderr)
    if limit is not None:
        signal.signal(signal.SIGALRM, _over_time)
        signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        for index, cell in enumerate(notebook.cells):
            if cell.cell_type != "code":
                continue
            began, OUTPUTS.cell = time.perf_counter(), cell
            cell.outputs = []
            why = "needs-tcp" in cell.metadata.get("tags", []) and no_tcp_reason()
            if why:
                text = f"Not run on this machine: {why}; the cell joins processes over TCP.\n"
                cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text=text)]
                OUTPUTS.cell = None
                continue
            with contextlib.redirect_stdout(streams[0]), contextlib.redirect_stderr(streams[1]):
                result = shell.run_cell(cell.source, store_history=True)
            cell.execution_count = shell.execution_count - 1
            OUTPUTS.cell = None
            error = result.error_before_exec or result.error_in_exec
            failure = error and CellError(index, type(error).__name__, str(error))
            if on_cell is not None and (error is None or keep_going):
                on_cell(index, time.perf_counter() - began, failure)
            if error is not None:
                failures.append(failure)
                if not keep_going or isinstance(error, OverTimeLimit):
                    break
    finally:
        if limit is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
        OUTPUTS.cell = None
        os.chdir(previous)
        _Shell.clear_instance()  # clears InteractiveShell's singleton too
    return failures
