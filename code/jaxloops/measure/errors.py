"""What a call raised, as a value: a page shows an error in a visible cell (a `try` that
prints it) and checks the same call again with `raised_by`, without keeping a variable
alive in the reader's cell only for the check."""

from collections.abc import Callable
from typing import Any


def raised_by(fn: Callable[..., Any], *args, **kwargs) -> Exception | None:
    """The exception `fn(*args, **kwargs)` raises, or None where it returns."""
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {fn!r}")
    try:
        fn(*args, **kwargs)
    except Exception as error:  # any error is the answer; BaseException (Ctrl-C) is not
        return error
    return None


def outcome(fn: Callable[..., Any], *args, **kwargs) -> str:
    """One line saying what `fn(*args, **kwargs)` did: "no error: returned <value>", or
    "<ErrorType>: <the first line of its message>"."""
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {fn!r}")
    try:
        value = fn(*args, **kwargs)
    except Exception as error:
        lines = str(error).strip().splitlines()
        return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return f"no error: returned {value}"
