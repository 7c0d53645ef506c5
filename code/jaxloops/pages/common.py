"""What every page shares: its checks, which stop the book's build and only warn in a
reader's own run, and the units its tables are written in.

A chapter asserts every claim it makes, so a build that contradicts its prose fails. A reader
who edits a cell ("multiply the weights by 10") changes the numbers on purpose: their run
should say which claim no longer holds and carry on. `make book` and `make chapter` set
JAXLOOPS_STRICT=1; a notebook opened anywhere else is not strict.
"""

import os
import warnings

from jaxloops.measure.compiled import MiB as MiB  # the one MiB, shared with the instruments

STRICT_ENV = "JAXLOOPS_STRICT"


class PageCheckWarning(UserWarning):
    """A claim of the page that this run's numbers do not support."""


def strict() -> bool:
    """True while the book (or `make chapter`) is being built: failed checks raise."""
    return os.environ.get(STRICT_ENV, "") == "1"


def check(condition, message: str) -> bool:
    """Checks one claim of a page: raises AssertionError(message) when strict, else warns.

    Returns:
      bool(condition), so a reader's cell can branch on it.
    """
    holds = bool(condition)
    if not holds:
        if strict():
            raise AssertionError(message)
        warnings.warn(
            f"this run does not support the page's claim: {message}", PageCheckWarning, stacklevel=2
        )
    return holds


def glue_all(prefix: str = "", **values) -> None:
    """Glues each value under `prefix + name`, not displayed, for the page's prose to quote
    (`{glue:text}`); myst_nb's `glue`, imported here because only a page's kernel has it."""
    from myst_nb import glue

    for name, value in values.items():
        glue(f"{prefix}{name}", value, display=False)


def failed(claims: dict) -> list[str]:
    """The claims (sentence -> whether it holds) that do not hold: what a page's findings
    return, and what its `check` reports."""
    return [claim for claim, holds in claims.items() if not holds]
