"""The training process that chapter 13 and its tests stop, kill and restart.

  python -m jaxloops.checkpoint_worker train mlp:DIR [transformer:DIR2 ...] --epochs 6
      [--stop-at 3] [--out f.npz]
      for each run: resumes from the newest good checkpoint in DIR (if any), trains to
      --stop-at (default --epochs) saving after every epoch; writes the final leaves of run i
      to --out as "i.params.dense_0.w", ...
  python -m jaxloops.checkpoint_worker mesh-save DIR --devices 8
  python -m jaxloops.checkpoint_worker mesh-restore DIR --devices 4 [--wait 60] --out f.npz
      save the MLP's initial state sharded over 8 CPU devices; restore it onto 4 (--wait:
      started alongside mesh-save, wait up to that many seconds for its checkpoint).

Each saved epoch prints "saved epoch E", flushed, so a parent can kill the process mid-run.
"""

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np


class Experiment(NamedTuple):
    """One run: `init()` gives fresh (params, opt_state); the rest is what `fit` takes."""

    key: jax.Array
    init: Callable[[], tuple]
    train_step: Callable
    data: Any
    batch_size: int


def experiment(model: str) -> Experiment:
    """The MLP on digits, or a small transformer on standard-library text; same every time.

    Build it once and call `init()` for each run: fit compiles once per train step. The
    key and the state are committed to the default device, as arrays restored from a
    checkpoint are: jit compiles one program for both, so a resumed process finds the
    uninterrupted run's program in the persistent compilation cache.
    """
    import jaxloops
    from jaxloops.text import VOCAB_SIZE

    sizes = jaxloops.experiment_sizes()
    device = jax.devices()[0]
    init_key, fit_key = jax.random.split(jax.random.key(0))
    if model == "mlp":
        data = jaxloops.to_device(jaxloops.load_digits_split(seed=0).train, 64, 10)
        init_params = lambda: jaxloops.init_mlp(init_key, (64, *sizes.loop.hidden, 10))
        optimizer = jaxloops.make_optimizer(sizes.loop.learning_rate, sizes.loop.weight_decay)
        loss, batch_size = jaxloops.mlp_loss, sizes.loop.batch_size
    elif model == "transformer":
        lm, part = sizes.lm, sizes.checkpoint
        corpus = jaxloops.load_stdlib_corpus(part.lm_text_bytes)
        data = jaxloops.spaced_windows(corpus.train, lm.seq_len, part.lm_windows)  # (windows, T)
        config = jaxloops.TransformerConfig(
            vocab_size=VOCAB_SIZE, num_layers=lm.layers, model_dim=lm.model_dim,
            num_heads=lm.heads, num_kv_heads=lm.kv_heads, hidden_dim=lm.hidden_dim,
            max_len=lm.seq_len,
        )  # fmt: skip
        init_params = lambda: jaxloops.init_transformer(init_key, config)
        optimizer = jaxloops.make_optimizer(lm.learning_rate, lm.weight_decay)
        loss, batch_size = jaxloops.transformer_loss, lm.batch_size
    else:
        raise ValueError(f"unknown model {model!r}; expected 'mlp' or 'transformer'")

    def init():
        params = init_params()
        return jax.device_put((params, optimizer.init(params)), device)

    train_step = jaxloops.make_train_step(loss, optimizer)
    return Experiment(jax.device_put(fit_key, device), init, train_step, data, batch_size)


def flat_arrays(tree) -> dict[str, np.ndarray]:
    """Every leaf on the host, by its path ('params.dense_0.w'); typed keys as key data."""
    from jaxloops.checkpoint import tree_paths

    leaves = jax.tree.leaves(tree)
    names = list(tree_paths(tree))
    return {
        name: np.asarray(
            jax.random.key_data(leaf)
            if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
            else leaf
        )
        for name, leaf in zip(names, leaves)
    }


def train(model: str, run: Experiment, directory: str, stop_at: int, keep_last: int, slow: float):
    """Resumes from `directory` if it holds a good checkpoint, trains to `stop_at`, saving."""
    import jaxloops
    from jaxloops import checkpoint

    manager = checkpoint.checkpoint_manager(directory, keep_last=keep_last)
    restored = checkpoint.restore_latest(manager, run.key, *jax.eval_shape(run.init))
    if restored is None:
        start, key, (params, opt_state) = 0, run.key, run.init()
    else:
        start, key, params, opt_state = restored
    print(f"{model}: starting at epoch {start}", flush=True)
    save = checkpoint.checkpoint_hook(manager, key)

    def hook(epoch, params, opt_state):
        save(epoch, params, opt_state)
        print(f"{model}: saved epoch {epoch}", flush=True)
        time.sleep(slow)  # a long run: leaves time to kill it between epochs

    params, opt_state, _ = jaxloops.fit(
        key, params, opt_state, run.train_step, run.data, batch_size=run.batch_size,
        epochs=stop_at, epochs_per_call=1, start_epoch=start, hook=hook,
    )  # fmt: skip
    manager.wait_until_finished()
    manager.close()
    return {"params": params, "opt_state": opt_state}


def worker_command(*args) -> list[str]:
    """The command line that runs this module in a new Python process."""
    return [sys.executable, "-m", "jaxloops.checkpoint_worker", *map(str, args)]


def kill_after(command: list[str], line: str) -> tuple[int, list[str]]:
    """Starts `command` and kills it with SIGKILL as soon as it prints `line`.

    Returns:
      (its exit status: -9 if it was killed, the lines it printed).
    """
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=os.environ
    )
    printed = []
    for out in process.stdout:
        printed.append(out.rstrip("\n"))
        if printed[-1] == line:
            os.kill(process.pid, signal.SIGKILL)  # no cleanup, no flush: as a preemption
            break
    process.stdout.close()
    return process.wait(), printed


def mesh_sharding(mesh, leaf):
    """Shards a leaf's largest axis that the mesh's devices divide evenly; else replicates."""
    from jax.sharding import NamedSharding, PartitionSpec

    count = mesh.devices.size
    axes = [i for i in np.argsort(leaf.shape)[::-1] if leaf.shape[i] % count == 0]
    spec = [None] * len(leaf.shape)
    if axes:
        spec[axes[0]] = "devices"
    return NamedSharding(mesh, PartitionSpec(*spec))


def mesh_state(devices: int, abstract: bool):
    """The MLP's initial state sharded over a 1-D mesh of `devices` devices.

    abstract: only shapes, dtypes and shardings (jax.ShapeDtypeStruct), no values.
    """
    import jaxloops

    sizes = jaxloops.experiment_sizes()
    init_key, fit_key = jax.random.split(jax.random.key(0))  # as in experiment("mlp")
    optimizer = jaxloops.make_optimizer(sizes.loop.learning_rate, sizes.loop.weight_decay)

    def init():
        params = jaxloops.init_mlp(init_key, (64, *sizes.loop.hidden, 10))
        return params, optimizer.init(params)

    mesh = jax.make_mesh((devices,), ("devices",))
    shapes = jax.eval_shape(init)
    shardings = jax.tree.map(lambda leaf: mesh_sharding(mesh, leaf), shapes)
    if abstract:
        as_abstract = lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s)
        params, opt_state = jax.tree.map(as_abstract, shapes, shardings)
    else:  # one compiled program makes every shard in place, not one per operation
        params, opt_state = jax.jit(init, out_shardings=shardings)()
    return fit_key, params, opt_state


def wait_for_checkpoint(directory, seconds: float) -> None:
    """Waits until `directory` holds a complete checkpoint (a step directory, named by its
    number: orbax writes into a temporary directory and renames it only when complete)."""
    directory, deadline = pathlib.Path(directory), time.monotonic() + seconds
    while not (directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir())):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no complete checkpoint in {directory} after {seconds} s")
        time.sleep(0.05)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["train", "mesh-save", "mesh-restore"])
    parser.add_argument("runs", nargs="+", help="MODEL:DIR for train, DIR for mesh-*")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--stop-at", type=int, default=None)
    parser.add_argument("--keep-last", type=int, default=3)
    parser.add_argument("--slow", type=float, default=0.0, help="seconds to sleep per epoch")
    parser.add_argument("--devices", type=int, default=None, help="simulated CPU devices")
    parser.add_argument("--out", default=None, help=".npz file for the final leaves")
    parser.add_argument("--wait", type=float, default=0.0, help="mesh-restore: seconds to wait")
    args = parser.parse_args(argv)
    if args.devices is not None:
        jax.config.update("jax_num_cpu_devices", args.devices)  # before the backend starts
    from jaxloops import checkpoint

    if args.command == "train":
        stop_at = args.epochs if args.stop_at is None else args.stop_at
        state, runs = {}, {}
        for i, run in enumerate(args.runs):
            model, _, directory = run.partition(":")
            if model not in runs:  # built once per model: one compiled train step each
                runs[model] = experiment(model)
            state[str(i)] = train(model, runs[model], directory, stop_at, args.keep_last, args.slow)
    else:
        (directory,) = args.runs
        abstract = args.command == "mesh-restore"  # restored values can only come from disk
        key, params, opt_state = mesh_state(jax.device_count(), abstract)
        if abstract:
            wait_for_checkpoint(directory, args.wait)
        manager = checkpoint.checkpoint_manager(directory, keep_last=1)
        if args.command == "mesh-save":
            checkpoint.checkpoint_hook(manager, key)(0, params, opt_state)
            manager.wait_until_finished()
            state = {"params": params}
        else:
            state = checkpoint.restore_latest(manager, key, params, opt_state)._asdict()
            state = {"params": state["params"]}
        named = list(zip(checkpoint.tree_paths(state), jax.tree.leaves(state)))
        shards = {name: len(leaf.addressable_shards) for name, leaf in named}
        # split: each device holds a piece of the array, not a copy of all of it
        split = {name: leaf.sharding.shard_shape(leaf.shape) != leaf.shape for name, leaf in named}
        report = {"devices": jax.device_count(), "shards": shards, "split": split}
        print(json.dumps(report), flush=True)
    if args.out is not None:
        np.savez(args.out, **flat_arrays(state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
