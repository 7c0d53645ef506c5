"""A program too large for its device, as a measured fact: what a refusal to compile says.

XLA:TPU checks a program against the chip's memory when it compiles it, and refuses one that
does not fit: "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO
temporaries (18.13G) exceeds available HBM (15.75G)." (a TPU v5e, 2026-12-06: chapter 8b's
plain `jax.grad` of the blockwise walk at T = 16384; the same from an ahead-of-time compile for
a v5e topology). The figures are GiB to two decimals; the chip's 15.75 is the limit
`memory_stats` gives. Where a chapter's lesson is that a program does not fit, the refusal's
count of its temporaries is the measurement, and the page says so instead of stopping.
"""

import re
from collections.abc import Callable
from typing import Any

import jax

from jaxloops.measure.compiled import compiled_costs

_REFUSED = re.compile(
    r"HLO temporaries \(([\d.]+)([KMGT]?)\) exceeds available (\w+) \(([\d.]+)([KMGT]?)\)"
)
_UNIT = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def refused_for_memory(error: BaseException) -> dict | None:
    """What an out-of-memory refusal to compile says, or None if `error` is not one:
    {"temp_bytes": the temporaries the compiler asked for, "available_bytes": what the device
    has, "memory": its name ("HBM"), "error": the refusal's first line}. The byte counts are
    the message's, rounded as it rounds them (to 0.01 GiB)."""
    text = str(error)
    found = _REFUSED.search(text) if "RESOURCE_EXHAUSTED" in text else None
    if found is None:
        return None
    needed, needed_unit, memory, available, available_unit = found.groups()
    return {
        "temp_bytes": int(float(needed) * _UNIT[needed_unit]),
        "available_bytes": int(float(available) * _UNIT[available_unit]),
        "memory": memory,
        "error": text.strip().splitlines()[0],
    }


def scratch_or_refusal(fn: Callable[..., Any], *args) -> dict:
    """The scratch of the compiled program of `jax.jit(fn)(*args)` (`compiled_costs`'s
    temp_bytes), or, where the backend refuses to compile it for want of memory, the
    temporaries its refusal names: the compiler's own count, a measured fact too.

    Returns:
      {"temp_bytes", "refused"}: `refused` is None for a program that compiled, else
      `refused_for_memory`'s dict. Any other error is raised.
    """
    try:
        return {"temp_bytes": compiled_costs(fn, *args)["temp_bytes"], "refused": None}
    except jax.errors.JaxRuntimeError as error:
        refused = refused_for_memory(error)
        if refused is None:
            raise
        return {"temp_bytes": refused["temp_bytes"], "refused": refused}
