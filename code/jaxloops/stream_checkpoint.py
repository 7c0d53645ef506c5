"""Chapter 15: the model and the data iterator's position in one orbax checkpoint.

A step's checkpoint holds three items: "state" (params and optimizer state, StandardSave),
"data" (the Grain iterator's state, through Grain's own orbax handler) and "progress" (the
step reached and the dataset's fingerprint, JsonSave). The iterator's state is a position in
the stream, `{"next_index": i}`; it means something only for the dataset it was read from,
so a restore first compares the fingerprints. Grain saves that state per process
(`process_<i>-of-<n>.json` in the step's "data" item): it restores into a run with as many
processes, not onto another process count.
"""

import pathlib
from typing import NamedTuple

import grain
import jax
import orbax.checkpoint as ocp

from jaxloops.checkpoint import Mismatch, abstract_array, restore_newest
from jaxloops.paths import writable_directory
from jaxloops.streaming import check_iterator_state


class Resumed(NamedTuple):
    """What `restore_stream` read back: the step reached, the state, the iterator moved on."""

    step: int
    params: object
    opt_state: object
    iterator: grain.DatasetIterator


def stream_manager(directory, *, keep_last: int) -> ocp.CheckpointManager:
    """A CheckpointManager over `directory` with the three items, saving asynchronously.

    Raises:
      ValueError: `keep_last` below 1, or a directory that names a file, lacks its parent or
        cannot be written (naming the path).
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    directory = writable_directory(directory, "checkpoint directory")
    handlers = {
        "state": ocp.StandardCheckpointHandler(),
        "data": grain.checkpoint.CheckpointHandler(),
        "progress": ocp.JsonCheckpointHandler(),
    }
    options = ocp.CheckpointManagerOptions(max_to_keep=keep_last, enable_async_checkpointing=True)
    return ocp.CheckpointManager(directory, options=options, item_handlers=handlers)


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
    """Restores the newest checkpoint that reads back whole into `iterator` (moved to the
    saved position) and the structure of `params` and `opt_state`; None if there is none.

    A checkpoint that fails to read is reported and the next older one tried, as chapter
    13's `restore_latest` does (`checkpoint.restore_newest`, shared by both); if none reads,
    the iterator is put back where it was.

    Raises:
      Mismatch (a ValueError): the checkpoint's iterator state is for another dataset (its
        fingerprint differs from `fingerprint`) or points outside this dataset's `batches`
        batches.
    """
    abstract = jax.tree.map(abstract_array, {"params": params, "opt_state": opt_state})
    where = iterator.get_state()

    def fits(state, saved_fingerprint):
        try:
            check_iterator_state(state, fingerprint, saved_fingerprint, batches)
        except ValueError as error:  # a whole checkpoint of another stream: not broken
            raise Mismatch(str(error)) from None

    def read(step):
        # Grain writes one state per process, named by its index and the process count.
        data = pathlib.Path(manager.directory) / str(step) / "data"
        saved = sorted(path.name for path in data.glob("process_*-of-*.json"))
        mine = f"process_{jax.process_index()}-of-{jax.process_count()}.json"
        if saved and mine not in saved:
            raise Mismatch(
                f"checkpoint step {step}: its iterator state is {', '.join(saved)}, this "
                f"process would read {mine}: Grain's state does not reshard across process counts"
            )
        progress = manager.restore(step, args=ocp.args.Composite(progress=ocp.args.JsonRestore()))
        saved_fingerprint = progress["progress"]["dataset"]
        fits({"next_index": 0}, saved_fingerprint)
        restored = manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract),
                data=grain.checkpoint.CheckpointRestore(iterator),
            ),
        )
        fits(iterator.get_state(), saved_fingerprint)
        return restored

    found = None
    try:
        found = restore_newest(manager, read)
    finally:
        if found is None:  # no step read back (or a Mismatch): the iterator where it was
            iterator.set_state(where)
    if found is None:
        return None
    step, restored = found
    state = restored["state"]
    return Resumed(step, state["params"], state["opt_state"], restored["data"])
