"""Chapter 15: the model and the data iterator's position in one orbax checkpoint.

A step's checkpoint holds three items: "state" (params and optimizer state, StandardSave),
"data" (the Grain iterator's state, through Grain's own orbax handler) and "progress" (the
step reached and the dataset's fingerprint, JsonSave). The iterator's state is a position in
the stream, `{"next_index": i}`; it means something only for the dataset it was read from,
so a restore first compares the fingerprints.
"""

import pathlib
from typing import NamedTuple

import grain
import jax
import orbax.checkpoint as ocp

from jaxloops.checkpoint import abstract_array
from jaxloops.streaming import check_iterator_state


class Resumed(NamedTuple):
    """What `restore_stream` read back: the step reached, the state, the iterator moved on."""

    step: int
    params: object
    opt_state: object
    iterator: grain.DatasetIterator


def stream_manager(directory, *, keep_last: int) -> ocp.CheckpointManager:
    """A CheckpointManager over `directory` with the three items, saving asynchronously."""
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    handlers = {
        "state": ocp.StandardCheckpointHandler(),
        "data": grain.checkpoint.CheckpointHandler(),
        "progress": ocp.JsonCheckpointHandler(),
    }
    options = ocp.CheckpointManagerOptions(max_to_keep=keep_last, enable_async_checkpointing=True)
    return ocp.CheckpointManager(
        pathlib.Path(directory).absolute(), options=options, item_handlers=handlers
    )


def save_stream(manager, step: int, params, opt_state, iterator, fingerprint: dict) -> None:
    """Saves the state after `step` steps and the iterator's position (the batches the steps
    have taken: a prefetching iterator counts what it handed out, not what it read ahead)."""
    manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
            data=grain.checkpoint.CheckpointSave(iterator),
            progress=ocp.args.JsonSave({"step": step, "dataset": fingerprint}),
        ),
    )


def restore_stream(manager, params, opt_state, iterator, fingerprint: dict, batches: int):
    """Restores the newest checkpoint into `iterator` (moved to the saved position) and the
    structure of `params` and `opt_state`; None if there is none.

    Raises:
      ValueError: the checkpoint's iterator state is for another dataset (its fingerprint
        differs from `fingerprint`) or points outside this dataset's `batches` batches.
    """
    step = manager.latest_step()
    if step is None:
        return None
    progress = manager.restore(step, args=ocp.args.Composite(progress=ocp.args.JsonRestore()))
    saved_fingerprint = progress["progress"]["dataset"]
    check_iterator_state({"next_index": 0}, fingerprint, saved_fingerprint, batches)
    abstract = jax.tree.map(abstract_array, {"params": params, "opt_state": opt_state})
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract),
            data=grain.checkpoint.CheckpointRestore(iterator),
        ),
    )
    check_iterator_state(iterator.get_state(), fingerprint, saved_fingerprint, batches)
    state = restored["state"]
    return Resumed(step, state["params"], state["opt_state"], restored["data"])
