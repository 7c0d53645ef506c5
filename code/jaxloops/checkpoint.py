"""Checkpoints for `fit` with orbax-checkpoint: save what a resume needs, never load a broken one.

A checkpoint holds the parameters, the optimizer state and the data-order key (one
StandardSave item, "state") and the epoch reached (one JsonSave item, "progress"): epoch e's
order is `fold_in(key, e)`, so `fit(..., start_epoch=epoch)` replays the uninterrupted run.
"""

import base64
import errno
import json
import pathlib
import re
import time
import warnings
from typing import Any, NamedTuple

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

from jaxloops.loop import Hook
from jaxloops.paths import existing_directory, writable_directory

TMP_SUFFIX = ".orbax-checkpoint-tmp"  # orbax's name for a step directory still being written


class BrokenCheckpointWarning(UserWarning):
    """A checkpoint on disk could not be read; an older one is used instead."""


class Mismatch(ValueError):
    """A checkpoint reads back whole but does not fit what it is restored into: the
    program's mistake, not the disk's, so no older checkpoint is tried."""


class Restored(NamedTuple):
    """What `restore_latest` read back: everything `fit` needs to resume."""

    epoch: int  # epochs completed: pass as start_epoch
    key: jax.Array  # the data-order key of the run
    params: Any
    opt_state: Any


def checkpoint_manager(
    directory, *, keep_last: int, best_metric: str | None = None, every: int = 1
) -> ocp.CheckpointManager:
    """A CheckpointManager over `directory` that saves asynchronously.

    Keeps the `keep_last` newest checkpoints and, if `best_metric` is given, also the one
    with the lowest value of that metric (e.g. "val_loss"); deletes the rest. Its creation
    starts deleting the temporary directories of saves that never completed (on a
    background thread; its first save waits for that to finish).

    Args:
      directory: created if missing; its parent must exist and be writable.
      every: the save interval: `save(step)` writes when step is a multiple of it (and
        returns False otherwise), or when the processes' preemption sync point is `step`
        (under `jax.distributed`, after a SIGTERM reached any of them).
    Raises:
      ValueError: a count below 1, or a directory that names a file, lacks its parent or
        cannot be written (naming the path).
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be >= 1, got {keep_last}")
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    directory = writable_directory(directory, "checkpoint directory")
    keep = [checkpoint_managers.LatestN(n=keep_last)]
    if best_metric is not None:
        lowest = checkpoint_managers.BestN(
            get_metric_fn=lambda metrics: metrics[best_metric], reverse=True, n=1
        )
        keep.append(lowest)
    # A save_decision_policy replaces orbax's default one, preemption save included: keep it.
    when = checkpoint_managers.AnySavePolicy(
        [
            checkpoint_managers.FixedIntervalPolicy(every),
            checkpoint_managers.PreemptionCheckpointingPolicy(),
        ]
    )
    options = ocp.CheckpointManagerOptions(
        preservation_policy=checkpoint_managers.AnyPreservationPolicy(keep),
        enable_async_checkpointing=True,
        cleanup_tmp_directories=True,  # a save cut off by a kill left one behind
        save_decision_policy=when,
    )
    handlers = {"state": ocp.StandardCheckpointHandler(), "progress": ocp.JsonCheckpointHandler()}
    return ocp.CheckpointManager(directory, options=options, item_handlers=handlers)


def checkpoint_hook(
    manager: ocp.CheckpointManager, key: jax.Array, evaluate=None, force=None
) -> Hook:
    """A `fit` hook that saves a checkpoint, step = epoch, after every compiled call.

    Args:
      key: the data-order key given to `fit` (a typed key, saved with the state).
      evaluate: optional `evaluate(params) -> {"val_loss": ...}`; its metrics are saved
        with the checkpoint (for keeping the best) and returned to `fit`'s History.
      force: optional `force() -> bool`: True saves this epoch whatever the save interval
        (a preemption notice has come).
    Returns:
      The hook. It returns the metrics, with "stop": True once orbax has saved the epoch for
      a preemption (the processes' sync point, under `jax.distributed`): `fit` then ends.
    """

    def hook(epoch, params, opt_state):
        metrics = None
        if evaluate is not None:
            metrics = {name: float(value) for name, value in evaluate(params).items()}
        state = {"params": params, "opt_state": opt_state, "key": key}
        manager.save(
            epoch,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), progress=ocp.args.JsonSave({"epoch": epoch})
            ),
            metrics=metrics,
            force=force is not None and force(),
        )
        # save() returns once the arrays are copied to the host; the write to disk goes on
        # in a background thread, so fit may donate params and opt_state to its next call.
        if manager.reached_preemption(epoch):  # every process saved this epoch: stop here
            manager.wait_until_finished()
            return {**(metrics or {}), "stop": True}
        return metrics

    return hook


def restore_latest(manager: ocp.CheckpointManager, key, params, opt_state) -> Restored | None:
    """Restores the newest checkpoint that reads back whole; None if there is none.

    A checkpoint that fails to read (a file missing, truncated or corrupt) is reported with
    a BrokenCheckpointWarning naming its step and the file, and the next older one is tried.

    Args:
      key, params, opt_state: the structure to restore into: arrays or
        jax.ShapeDtypeStruct, whose shardings say where the restored arrays go; a leaf
        without one goes where `key` lives.
    Raises:
      Mismatch (a ValueError): the checkpoint's tree does not match (names the path in it).
    """
    target = {"params": params, "opt_state": opt_state, "key": key}
    # a leaf given without a sharding goes where the key lives (the run's device)
    where = getattr(key, "sharding", None)
    abstract = jax.tree.map(lambda leaf: abstract_array(leaf, where), target)

    def read(step):
        saved = manager.item_metadata(step)["state"]
        if saved is None or not jax.tree.leaves(saved):  # orbax reads a lost index as empty
            index = pathlib.Path(manager.directory) / str(step) / "state" / "_METADATA"
            raise FileNotFoundError(errno.ENOENT, "no readable tree metadata", str(index))
        check_structure(saved, abstract, step)
        return manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract), progress=ocp.args.JsonRestore()
            ),
        )

    found = restore_newest(manager, read)
    if found is None:
        return None
    _, restored = found
    state = restored["state"]
    epoch = restored["progress"]["epoch"]
    return Restored(epoch, state["key"], state["params"], state["opt_state"])


def restore_newest(manager: ocp.CheckpointManager, read):
    """(step, read(step)) for the newest step of `manager` that `read` reads back whole;
    None if none does.

    A step whose read raises is reported (a BrokenCheckpointWarning naming the step and the
    file that failed) and the next older one is tried. A `Mismatch` is raised at once: the
    checkpoint is whole, the program restores it into the wrong thing.
    """
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            return step, read(step)
        except Mismatch:
            raise
        except Exception as error:  # noqa: BLE001 - any failure to read means broken
            report_broken(manager, step, error)
    return None


def abstract_array(leaf, default=None) -> jax.ShapeDtypeStruct:
    """The shape, dtype and sharding of an array (or of a ShapeDtypeStruct); a leaf with no
    sharding (`jax.eval_shape` gives none) gets `default`. Left with none, orbax uses the
    sharding the checkpoint was saved with: on a GPU machine, a checkpoint saved from CPU
    arrays then fails ("Device cpu:0 was not found in jax.local_devices()", seen on an H200)."""
    sharding = getattr(leaf, "sharding", None) or default
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)


def report_broken(manager: ocp.CheckpointManager, step: int, error: Exception) -> None:
    """Warns that checkpoint `step` is unreadable, naming the file that failed."""
    chain = []  # orbax wraps the storage layer's error: read the whole chain
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    text = " ".join(str(e) for e in chain)
    files = re.findall(r'local file "([^"]+)"', text)
    files += [e.filename for e in chain if getattr(e, "filename", None)]
    where = files[-1] if files else str(pathlib.Path(manager.directory) / str(step))
    entries = re.findall(r'Error reading "([^"]+)" in OCDBT', text)  # the array inside a file
    if entries and where.endswith("/"):
        where += f" (array {entries[-1].split('/')[0]})"
    reason = str(chain[-1]).split(" [tensorstore_spec")[0]
    warnings.warn(
        f"checkpoint step {step} is broken: {where}: {reason}; skipping it",
        BrokenCheckpointWarning,
        stacklevel=4,  # the caller of restore_latest or restore_stream
    )


def leaf_name(path) -> str:
    """A leaf's path in a tree as one name: ('params', 'dense_0', 'w') -> 'params.dense_0.w'."""
    return ".".join(
        str(getattr(part, "key", getattr(part, "idx", getattr(part, "name", part))))
        for part in path
    )


def tree_paths(tree) -> dict[str, tuple[tuple[int, ...], str]]:
    """'params.dense_0.w' -> (shape, dtype) for every leaf; typed keys as their key data."""
    leaves, _ = jax.tree.flatten_with_path(tree)
    out = {}
    for path, leaf in leaves:
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.eval_shape(jax.random.key_data, leaf)
        out[leaf_name(path)] = (tuple(leaf.shape), str(leaf.dtype))
    return out


def flat_arrays(tree) -> dict[str, np.ndarray]:
    """Every leaf on the host, named as in `tree_paths`; typed keys as their key data.

    A leaf split over devices is gathered whole; under several processes a leaf must be
    replicated (each process then holds all of it).
    """
    leaves, _ = jax.tree.flatten_with_path(tree)
    return {leaf_name(path): _on_host(leaf_name(path), leaf) for path, leaf in leaves}


def _on_host(name: str, leaf) -> np.ndarray:
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        if not leaf.sharding.is_fully_replicated:
            raise ValueError(f"{name} is split over processes; this process holds part of it")
        leaf = leaf.addressable_data(0)
    return np.asarray(leaf)


def check_structure(saved, target, step: int) -> None:
    """Raises a Mismatch (a ValueError) naming the first path where `saved` and `target`
    differ."""
    saved, target = tree_paths(saved), tree_paths(target)
    for name in sorted(saved.keys() | target.keys()):
        if name not in target:
            raise Mismatch(f"checkpoint step {step} has {name}, which the target tree lacks")
        if name not in saved:
            raise Mismatch(f"checkpoint step {step} has no {name}, which the target tree has")
        if saved[name] != target[name]:
            (s_shape, s_dtype), (t_shape, t_dtype) = saved[name], target[name]
            raise Mismatch(
                f"checkpoint step {step}: {name} is saved as {s_dtype}{list(s_shape)}, "
                f"the target has {t_dtype}{list(t_shape)}"
            )


def checkpoint_bytes(manager: ocp.CheckpointManager, step: int) -> int:
    """Bytes on disk of checkpoint `step`, every file counted; a ValueError naming the
    step's directory if it is not on disk (not 0 bytes)."""
    directory = pathlib.Path(manager.directory) / str(step)
    if not directory.is_dir():
        raise ValueError(f"checkpoint step {step} is not on disk: no directory {directory}")
    files = directory.rglob("*")
    return sum(path.stat().st_size for path in files if path.is_file())


def state_bytes(tree) -> int:
    """Bytes of the arrays of a tree (a typed key counts as its key data)."""
    leaves = jax.tree.leaves(tree)
    return sum(
        jax.random.key_data(leaf).nbytes
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
        else leaf.nbytes
        for leaf in leaves
    )


def stored_shardings(directory, step: int) -> dict[str, dict]:
    """What orbax (0.12.8) wrote about each array's sharding in a step: leaf name (as
    `flat_arrays` names it) -> the `_sharding` record (its "sharding_type", "axis_names",
    "partition_spec", "device_mesh") plus the "chunk_shape" each device wrote."""
    state = existing_directory(directory, "checkpoint directory") / str(step) / "state"
    if not state.is_dir():
        raise ValueError(f"checkpoint step {step} is not on disk: no directory {state}")
    records = json.loads((state / "_sharding").read_text())
    found = {base64.b64decode(k).decode(): json.loads(v) for k, v in records.items()}
    for path in (state / "array_metadatas").iterdir():
        for entry in json.loads(path.read_text())["array_metadatas"]:
            meta = entry["array_metadata"]
            found.setdefault(meta["param_name"], {})["chunk_shape"] = meta["chunk_shape"]
    return found


def temporary_dirs(directory) -> list[str]:
    """The names of the unfinished saves' directories in `directory` (orbax's suffix)."""
    directory = existing_directory(directory, "checkpoint directory")
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(TMP_SUFFIX))


def wait_for_no_temporary_dirs(directory, seconds: float) -> list[str]:
    """Waits up to `seconds` for the unfinished saves in `directory` to be deleted (creating a
    `checkpoint_manager` over it starts that, on a background thread); returns those left."""
    if seconds < 0:
        raise ValueError(f"seconds must be >= 0, got {seconds}")
    deadline = time.monotonic() + seconds
    while (left := temporary_dirs(directory)) and time.monotonic() < deadline:
        time.sleep(0.01)
    return left
