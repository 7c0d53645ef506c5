"""The first failing cell of a failed book build, and its error, from the build's log.

    python3 .ci/failing_cell.py _build/book.log

The traceback sits in the middle of a long log; CI (.ci/run) repeats it last. A build stopped
at a time limit fails no cell: then it says which chapters were executed, in how long, and
which one was still executing.
"""

import pathlib
import re
import sys

CELL_ERROR = re.compile(
    r"An error occurred while executing the following cell:\n(.*?)"
    r"(?:\nException occurred|\nThe above exception|\Z)",
    re.S,
)
EXECUTING = re.compile(r"book/(\w+)\.md: Execut(?:ing notebook|ed notebook in ([\d.]+) seconds)")


def chapters_executed(text: str) -> str:
    """Which chapters a book build executed, with their seconds, and the one it was still
    executing when it stopped."""
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
    """The first failing cell and its error; else which chapters the build executed (and in
    how long), or, where it executed none, the log's last lines."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", log)
    blocks = CELL_ERROR.findall(text)
    if not blocks and EXECUTING.search(text):
        return chapters_executed(text)
    lines = blocks[0].strip("\n").splitlines() if blocks else text.splitlines()[-max_lines:]
    if len(lines) > max_lines:
        lines = lines[:20] + ["[...]"] + lines[-(max_lines - 21) :]
    return "\n".join(lines)


if __name__ == "__main__":
    print(failing_cell(pathlib.Path(sys.argv[1]).read_text(errors="replace")))
