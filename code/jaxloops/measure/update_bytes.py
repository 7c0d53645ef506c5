"""What a train step must move a float32 parameter, by optimizer, and the control that tests it.

Chapter 7 asks what bounds `fit`'s step on a chip once dispatch is gone. Its prediction: the
bytes each parameter moves a step, at the read bandwidth the build measured, give a floor;
its control: the same `fit` with an optimizer that moves fewer bytes. If the bytes bound the
step, the two steps' times keep the ratio of their bytes; if a cost both share does (the
loop, the matmuls), they take about the same.
"""

from collections.abc import Callable
from typing import Any

import numpy as np

from jaxloops.measure import timing


def bytes_moved(optimizer: str) -> dict[str, int]:
    """Bytes one float32 parameter moves a step under `optimizer`, at least.

    The forward pass reads each weight; the update reads the parameter and the
    optimizer's state for it, and writes them back. Not counted: the gradient,
    the activations, the batch."""
    if optimizer == "AdamW":  # its state: the parameter and two moments
        return {"forward read": 4, "update reads": 4 + 8, "update writes": 4 + 8}
    if optimizer == "SGD":  # its state: the parameter
        return {"forward read": 4, "update reads": 4, "update writes": 4}
    raise ValueError(f"optimizer {optimizer!r}: the floor counts 'AdamW' and 'SGD'")


# The gradient's round trip, not in the floor: the backward pass writes it, the update reads it
GRADIENT_BYTES = 4 + 4


def bytes_per_parameter(optimizer: str) -> int:
    """The floor's bytes a float32 parameter a step under `optimizer` ("AdamW" or "SGD")."""
    return sum(bytes_moved(optimizer).values())


def bytes_sum(optimizer: str) -> str:
    """The floor's bytes written as their sum, "4 + 12 + 12" for AdamW."""
    return " + ".join(str(b) for b in bytes_moved(optimizer).values())


def floor_seconds(parameters: int, optimizer: str, bytes_per_s: float) -> float:
    """The least time a step can take if its bytes bound it: `parameters` float32 parameters,
    each moving `bytes_per_parameter(optimizer)` bytes, at `bytes_per_s`."""
    if parameters < 1 or not bytes_per_s > 0:
        raise ValueError(f"need parameters >= 1 and bytes_per_s > 0, got {parameters}, "
                         f"{bytes_per_s}")  # fmt: skip
    return bytes_per_parameter(optimizer) * parameters / bytes_per_s


def seconds_per_step(
    runs: dict[str, Callable[[], Any]], steps: int, rounds: int = 9
) -> dict[str, float]:
    """Each run's median time over `rounds` rounds taken in turn (`timing.interleaved_samples`),
    divided by the `steps` each run takes: a step's time, all in (a run's fixed cost is spread
    over its steps)."""
    if steps < 1:
        raise ValueError(f"need steps >= 1, got {steps}")
    samples = timing.interleaved_samples(runs, rounds)
    return {name: float(np.median(s)) / steps for name, s in samples.items()}


def step_needed(dispatch_seconds: float, times_faster: float) -> float:
    """The step time at which `fit` is `times_faster` times a Python loop that pays at least
    `dispatch_seconds` a step: the loop's step over the goal."""
    if not dispatch_seconds > 0 or not times_faster > 0:
        raise ValueError(f"need dispatch_seconds > 0 and times_faster > 0, got "
                         f"{dispatch_seconds}, {times_faster}")  # fmt: skip
    return dispatch_seconds / times_faster
