"""Validation during training: held-out metrics through `fit`'s hook, early stopping on
them, the best checkpoint read back, and when two sets of seeded runs differ."""

import math
from collections.abc import Callable

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxloops.checkpoint import abstract_array
from jaxloops.data import Batch
from jaxloops.loop import Hook


def validation_metrics(loss_fn: Callable, data: Batch) -> Callable[..., dict[str, jax.Array]]:
    """`params -> {"val_loss": ..., "val_<aux>": ...}` over the whole validation set.

    The metrics stay on the device: `fit` fetches what a hook returns once, at the end, so
    recording them costs no wait between epochs; reading one on the host (`float`, as
    `early_stopping` must) waits for it. `loss_fn(params, batch) -> (loss, aux)` is called
    without a key, so a model with dropout is evaluated without it: the same params give
    the same metrics every time.
    """
    loss = jax.jit(loss_fn)

    def metrics(params) -> dict[str, jax.Array]:
        value, aux = loss(params, data)
        return {"val_loss": value, **{f"val_{name}": v for name, v in aux.items()}}

    return metrics


def early_stopping(hook: Hook, metric: str, patience: int) -> Hook:
    """Wraps `hook` (which returns `metric`, lower is better) to stop `fit` once `patience`
    calls in a row have not improved on the best value so far.

    The records gain "best_epoch" (the epoch of the best value yet) and, on the call that
    ends the run, "stop": True.
    """
    if patience < 1:
        raise ValueError(f"patience must be >= 1 call, got {patience}")
    best = {"value": float("inf"), "epoch": None, "calls_since": 0}

    def stopping(epoch, params, opt_state):
        recorded = dict(hook(epoch, params, opt_state) or {})
        if metric not in recorded:
            raise ValueError(f"the hook returned {sorted(recorded)}, not {metric!r}")
        value = float(recorded[metric])  # waits for the evaluation: the decision needs it
        if value < best["value"]:
            best.update(value=value, epoch=epoch, calls_since=0)
        else:
            best["calls_since"] += 1
        recorded["best_epoch"] = best["epoch"]
        if best["calls_since"] >= patience:
            recorded["stop"] = True
        return recorded

    return stopping


def restore_step(manager: ocp.CheckpointManager, step: int, key, params, opt_state) -> dict:
    """The state `checkpoint_hook` saved at `step` (e.g. the best one the manager kept).

    Args:
      key, params, opt_state: the structure to restore into (arrays or ShapeDtypeStruct).
    Returns:
      {"params": ..., "opt_state": ..., "key": ...}.
    """
    manager.wait_until_finished()
    if step not in manager.all_steps():
        raise ValueError(f"no checkpoint of step {step}; kept: {sorted(manager.all_steps())}")
    target = {"params": params, "opt_state": opt_state, "key": key}
    abstract = jax.tree.map(abstract_array, target)
    restored = manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
    )
    return restored["state"]


def seeds_separate(a, b) -> bool:
    """True when every run in `a` ends on one side of every run in `b` (the ranges of the
    two sets of seeds do not overlap)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.size < 2 or b.size < 2:
        raise ValueError(f"need at least 2 runs on each side, got {a.size} and {b.size}")
    return bool(a.max() < b.min() or b.max() < a.min())


def chance_of_separation(n: int, m: int) -> float:
    """The probability that n and m runs of one and the same distribution separate by chance:
    2 of the C(n + m, n) equally likely orderings of the runs put one set wholly below."""
    return 2 / math.comb(n + m, n)
