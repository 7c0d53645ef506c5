"""The training process that chapter 13 and its tests stop, kill and restart.

  python -m jaxloops.workers.checkpoint train mlp:DIR [transformer:DIR2 ...] --sizes JSON
      --epochs 6 [--stop-at 3] [--every 1] [--lost-at 2] [--out f.npz]
      for each run: resumes from the newest good checkpoint in DIR (if any), trains to
      --stop-at (default --epochs) saving every --every epochs; writes the final leaves of
      run i to --out as "i.params.dense_0.w", ...; on SIGTERM saves the epoch it is in and
      exits with status 0; with --lost-at E it SIGKILLs itself once epoch E's save has begun
  python -m jaxloops.workers.checkpoint mesh-save DIR --devices 8 --sizes JSON
  python -m jaxloops.workers.checkpoint mesh-restore DIR --devices 4 [--wait 60] --out f.npz
      save the MLP's initial state (params and optimizer state) split over 8 CPU devices
      (chapter 12's FSDP rule); restore it onto 4 (--wait: started alongside mesh-save,
      wait up to that many seconds for its checkpoint).
  python -m jaxloops.workers.checkpoint together DIR --process I --processes 2 --port P
      --epochs E --every K --slow S --sizes JSON
      one of the processes that `preempt_together` starts: joined by jax.distributed, they
      train the MLP replicated over one CPU device each, saving every K epochs into DIR
      together, and stop once orbax has saved the epoch of their preemption sync point.

--sizes is `workers.sizes_json(sizes, "loop", "lm", "checkpoint")`: the parent's sizes. The
parent starts the process with `workers.cpu_env(devices)` (1 device for train). Each saved
epoch prints "saved epoch E", flushed, so a parent can kill the process mid-run.
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

from jaxloops import workers
from jaxloops.paths import writable_file


class Experiment(NamedTuple):
    """One run: `init()` gives fresh (params, opt_state); the rest is what `fit` takes."""

    key: jax.Array
    init: Callable[[], tuple]
    train_step: Callable
    data: Any
    batch_size: int


def experiment(model: str, sizes, device) -> Experiment:
    """The MLP on digits, or a small transformer on standard-library text; same every time.

    Build it once and call `init()` for each run: fit compiles once per train step. The
    key and the state are committed to `device`, as arrays restored from a checkpoint are:
    jit compiles one program for both, so a resumed process finds the uninterrupted run's
    program in the persistent compilation cache.

    Args:
      sizes: has the parts `loop` (the MLP), `lm` (the transformer's shape) and
        `checkpoint` (the transformer's data): `experiment_sizes()` or `sizes_from_json`.
      device: where every array of the run lives and every step runs.
    """
    import jaxloops
    from jaxloops.text import VOCAB_SIZE

    init_key, fit_key = jax.random.split(jax.random.key(0))
    with jax.default_device(device):
        if model == "mlp":
            data = jaxloops.to_device(jaxloops.load_digits_split(seed=0).train)
            init_params = lambda: jaxloops.init_mlp(init_key, sizes.loop.widths)
            loop = sizes.loop
            optimizer = jaxloops.make_optimizer(loop.learning_rate, loop.weight_decay)
            loss, batch_size = jaxloops.mlp_loss, loop.batch_size
        elif model == "transformer":
            lm, part = sizes.lm, sizes.checkpoint
            corpus = jaxloops.load_stdlib_corpus(part.lm_text_bytes)
            windows = jaxloops.spaced_windows(corpus.train, lm.max_len, part.lm_windows)
            data = jax.device_put(windows)  # x and y: (windows, T)
            config = jaxloops.TransformerConfig.from_sizes(lm, VOCAB_SIZE)  # fmt: skip
            init_params = lambda: jaxloops.init_transformer(init_key, config)
            optimizer = jaxloops.make_optimizer(lm.learning_rate, lm.weight_decay)
            loss, batch_size = jaxloops.transformer_loss, lm.batch_size
        else:
            raise ValueError(f"unknown model {model!r}; expected 'mlp' or 'transformer'")

    def init():
        with jax.default_device(device):
            params = init_params()
            return jax.device_put((params, optimizer.init(params)), device)

    train_step = jaxloops.make_train_step(loss, optimizer)
    return Experiment(jax.device_put(fit_key, device), init, train_step, data, batch_size)


def stepped_mlp_state(sizes, device):
    """`experiment("mlp")`'s state after one train step on the first batch of its data, on
    `device`: Adam's moments and step count are no longer their initial zeros, so a restore
    that re-initialised the optimizer does not pass for this state."""
    run = experiment("mlp", sizes, device)
    batch = jax.tree.map(lambda a: a[: run.batch_size], run.data)
    params, opt_state, _ = jax.jit(run.train_step)(*run.init(), batch)
    return params, opt_state


class Preempted(Exception):
    """SIGTERM arrived: the epoch it names was saved, and the run stops."""


def train(model: str, run: Experiment, directory: str, stop_at: int, keep_last: int, slow: float,
          every: int = 1, lost_at: int | None = None):  # fmt: skip
    """Resumes from `directory` if it holds a good checkpoint, trains to `stop_at`, saving
    every `every` epochs; on SIGTERM (a cluster's notice of preemption) saves the epoch it
    is in at its end, whatever the interval, and raises Preempted. With `lost_at`, the
    process SIGKILLs itself the moment epoch `lost_at`'s save is seen writing (its
    temporary directory exists): a machine lost while its background write is under way,
    on any machine however busy."""
    import jaxloops
    from jaxloops import checkpoint
    from jaxloops.paths import writable_directory

    writable_directory(directory, "checkpoint directory")  # before the handler or any work
    if slow < 0 or stop_at < 1:
        raise ValueError(f"need slow >= 0 s and stop_at >= 1, got {slow}, {stop_at}")
    notices = []
    signal.signal(signal.SIGTERM, lambda signum, frame: notices.append(signum))
    manager = checkpoint.checkpoint_manager(directory, keep_last=keep_last, every=every)
    restored = checkpoint.restore_latest(manager, run.key, *jax.eval_shape(run.init))
    if restored is None:
        start, key, (params, opt_state) = 0, run.key, run.init()
    else:
        start, key, params, opt_state = restored
    print(f"{model}: starting at epoch {start}", flush=True)
    save = checkpoint.checkpoint_hook(manager, key, force=lambda: bool(notices))

    def hook(epoch, params, opt_state):
        if epoch == lost_at:  # said first: a write to the parent's pipe may yield the core
            print(f"{model}: saving epoch {epoch}; the machine is lost", flush=True)
        save(epoch, params, opt_state)
        if epoch == lost_at:
            # The kill must land within the background write (43-86 ms): at once, once its
            # temporary directory exists (orbax may make it on its own thread).
            writing = pathlib.Path(directory) / f"{epoch}{checkpoint.TMP_SUFFIX}"
            deadline = time.monotonic() + 10.0
            while not writing.exists() and time.monotonic() < deadline:
                time.sleep(0.0005)
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no flush: the write is cut off
        if notices:
            manager.wait_until_finished()  # on disk before the process goes
            print(f"{model}: SIGTERM, saved epoch {epoch}", flush=True)
            raise Preempted(epoch)
        print(f"{model}: {'saved' if epoch % every == 0 else 'trained'} epoch {epoch}", flush=True)
        time.sleep(slow)  # a long run: leaves time to kill it between epochs

    params, opt_state, _ = jaxloops.fit(
        key, params, opt_state, run.train_step, run.data, batch_size=run.batch_size,
        epochs=stop_at, epochs_per_call=1, start_epoch=start, hook=hook,
    )  # fmt: skip
    manager.wait_until_finished()
    manager.close()
    return {"params": params, "opt_state": opt_state}


def kill_after(
    command: list[str], line: str, env: dict[str, str], sig: int = signal.SIGKILL
) -> tuple[int, list[str]]:
    """Starts `command` in environment `env` and sends it `sig` once it prints `line`:
    SIGKILL kills it at once; after any other signal its output is read to the end.

    Returns:
      (its exit status: -9 if it was killed, the lines it printed).
    """
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    printed = []
    for out in process.stdout:
        printed.append(out.rstrip("\n"))
        if printed[-1] == line:
            os.kill(process.pid, sig)  # SIGKILL: no cleanup, no flush, as a lost machine
            if sig == signal.SIGKILL:
                break
    process.stdout.close()
    return process.wait(), printed


def mesh_state(devices: int, abstract: bool, sizes):
    """The MLP's state after one step (`stepped_mlp_state`) split over a mesh of the first
    `devices` CPU devices, each leaf as chapter 12's FSDP splits it (`sharding.fsdp_spec`).

    Args:
      abstract: only shapes, dtypes and shardings (jax.ShapeDtypeStruct), no values.
      sizes: has the part `loop` (the MLP's widths and optimizer).
    """
    import jaxloops
    from jaxloops import sharding

    init_key, fit_key = jax.random.split(jax.random.key(0))  # as in experiment("mlp")
    optimizer = jaxloops.make_optimizer(sizes.loop.learning_rate, sizes.loop.weight_decay)

    def init():
        params = jaxloops.init_mlp(init_key, sizes.loop.widths)
        return params, optimizer.init(params)

    mesh = sharding.data_mesh(devices, devices=jax.devices("cpu"))
    shapes = jax.eval_shape(init)
    specs = sharding.strategy_specs(shapes, "fsdp", mesh)
    shardings = jax.tree.map(lambda spec: jax.sharding.NamedSharding(mesh, spec), specs)
    if abstract:
        as_abstract = lambda leaf, s: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=s)
        params, opt_state = jax.tree.map(as_abstract, shapes, shardings)
    else:  # computed on one device, as the reference is, then split
        state = stepped_mlp_state(sizes, jax.devices("cpu")[0])
        params, opt_state = jax.device_put(state, shardings)
    return fit_key, params, opt_state


def wait_for_checkpoint(directory, seconds: float) -> None:
    """Waits until `directory` holds a complete checkpoint (a step directory, named by its
    number: orbax writes into a temporary directory and renames it only when complete).

    Raises:
      ValueError: `directory`'s parent does not exist or it names a file, or `seconds` < 0.
    """
    from jaxloops.paths import writable_directory

    if seconds < 0:
        raise ValueError(f"seconds must be >= 0, got {seconds}")
    directory = writable_directory(directory, "checkpoint directory")  # may not exist yet
    deadline = time.monotonic() + seconds
    while not (directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir())):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no complete checkpoint in {directory} after {seconds} s")
        time.sleep(0.05)


def mesh_report(state) -> dict:
    """Devices, shards per leaf, and which leaves are split (each device holds a piece of
    the array, not a copy of all of it)."""
    from jaxloops.checkpoint import leaf_name

    named = [(leaf_name(path), leaf) for path, leaf in jax.tree.leaves_with_path(state)]
    shards = {name: len(leaf.addressable_shards) for name, leaf in named}
    split = {name: leaf.sharding.shard_shape(leaf.shape) != leaf.shape for name, leaf in named}
    devices = len(jax.tree.leaves(state)[0].sharding.device_set)  # the mesh's
    return {"devices": devices, "shards": shards, "split": split}


def mesh_save_or_restore(command: str, directory: str, devices: int, wait: float, sizes):
    """mesh-save: the state split over `devices`, saved; mesh-restore: read back onto them."""
    from jaxloops import checkpoint

    abstract = command == "mesh-restore"  # restored values can only come from disk
    key, params, opt_state = mesh_state(devices, abstract, sizes)
    if abstract:
        wait_for_checkpoint(directory, wait)
    manager = checkpoint.checkpoint_manager(directory, keep_last=1)
    if command == "mesh-save":
        checkpoint.checkpoint_hook(manager, key)(0, params, opt_state)
        manager.wait_until_finished()
        return {"params": params, "opt_state": opt_state}
    restored = checkpoint.restore_latest(manager, key, params, opt_state)
    return {"params": restored.params, "opt_state": restored.opt_state}


def train_together(directory, process: int, processes: int, port: int, epochs: int, every: int,
                   slow: float, sizes) -> int | None:  # fmt: skip
    """One of `processes` processes, joined by `jax.distributed` on localhost, that train the
    MLP replicated over one CPU device each, saving into `directory` together every `every`
    epochs. It installs no SIGTERM handler: JAX's preemption service catches the signal (in
    any process), the processes agree on a step, and `checkpoint_manager`'s
    `PreemptionCheckpointingPolicy` saves it. Each epoch prints "process I: trained epoch E".

    Returns:
      The epoch saved for the preemption, or None if the run ended without one.
    """
    import numpy as np

    import jaxloops
    from jaxloops import checkpoint

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"localhost:{port}", num_processes=processes, process_id=process
    )
    run = experiment("mlp", sizes, jax.local_devices(backend="cpu")[0])
    # One array over all processes' devices, the same values in each: no process waits for
    # another while it trains (no collective), so each goes at its own pace.
    mesh = jax.make_mesh((processes,), ("processes",), devices=jax.devices("cpu"))
    replicated = jax.NamedSharding(mesh, jax.P())
    everywhere = lambda a: jax.make_array_from_process_local_data(replicated, np.asarray(a))
    key = jax.random.wrap_key_data(everywhere(jax.random.key_data(run.key)))
    params, opt_state = jax.tree.map(everywhere, run.init())
    data = jax.tree.map(everywhere, run.data)
    manager = checkpoint.checkpoint_manager(directory, keep_last=1, every=every)
    save, preempted = checkpoint.checkpoint_hook(manager, key), []

    def hook(epoch, params, opt_state):
        recorded = save(epoch, params, opt_state)
        if recorded and recorded.get("stop"):
            preempted.append(epoch)
            print(f"process {process}: preempted, saved epoch {epoch}", flush=True)
            return recorded
        print(f"process {process}: trained epoch {epoch}", flush=True)
        time.sleep(slow)

    jaxloops.fit(key, params, opt_state, run.train_step, data, batch_size=run.batch_size,
                 epochs=epochs, epochs_per_call=1, hook=hook)  # fmt: skip
    manager.wait_until_finished()
    manager.close()
    return preempted[0] if preempted else None


def preempt_together(
    directory, *, epochs: int, every: int, slow: tuple[float, ...], signal_after: int,
    sizes_arg: str,
) -> tuple[list[int], list[list[str]]]:  # fmt: skip
    """Starts `len(slow)` processes of `train_together` (process i sleeping `slow[i]` s per
    epoch) and sends SIGTERM to the last one only, once it prints that it trained epoch
    `signal_after`. Each runs on one CPU device (`workers.cpu_env(1)`).

    Returns:
      (each process's exit status, the lines each printed).
    Raises:
      ValueError: fewer than 2 processes, a negative pace, or a directory that cannot be
        written (naming the path), before any process starts.
    """
    import socket

    from jaxloops.paths import writable_directory

    if len(slow) < 2 or min(slow) < 0:
        raise ValueError(f"need >= 2 processes and paces >= 0 s, got slow={slow}")
    if not 1 <= signal_after < epochs:
        raise ValueError(f"signal_after must be in [1, {epochs}), got {signal_after}")
    directory = writable_directory(directory, "checkpoint directory")
    with socket.socket() as probe:  # a port the coordinator can listen on
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    processes = len(slow)
    flags = ["--processes", processes, "--port", port, "--epochs", epochs, "--every", every]
    command = lambda i, pace: workers.command(  # noqa: E731 - one process's command line
        "checkpoint", "together", directory, "--process", i, *flags, "--slow", pace,
        "--sizes", sizes_arg,
    )  # fmt: skip
    env = {**workers.cpu_env(1), "JAX_ENABLE_COMPILATION_CACHE": "false"}
    running = [
        subprocess.Popen(
            command(i, pace), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
        )  # fmt: skip
        for i, pace in enumerate(slow)
    ]
    last, printed = running[-1], [[] for _ in running]
    for line in last.stdout:
        printed[-1].append(line.rstrip("\n"))
        if printed[-1][-1] == f"process {processes - 1}: trained epoch {signal_after}":
            os.kill(last.pid, signal.SIGTERM)  # this process only: the others learn from JAX
    for i, process in enumerate(running[:-1]):
        printed[i] = process.communicate(timeout=300)[0].splitlines()
    return [p.wait(timeout=300) for p in running], printed


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["train", "mesh-save", "mesh-restore", "together"])
    parser.add_argument("runs", nargs="+", help="MODEL:DIR for train, DIR for mesh-*, together")
    parser.add_argument("--sizes", required=True, help="JSON of the loop, lm, checkpoint parts")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--stop-at", type=int, default=None)
    parser.add_argument("--keep-last", type=int, default=3)
    parser.add_argument("--every", type=int, default=1, help="train: the save interval")
    parser.add_argument("--slow", type=float, default=0.0, help="seconds to sleep per epoch")
    parser.add_argument("--lost-at", type=int, default=None, help="train: SIGKILL itself mid-save")
    parser.add_argument("--devices", type=int, default=1, help="CPU devices (set by cpu_env)")
    parser.add_argument("--out", default=None, help=".npz file for the final leaves")
    parser.add_argument("--wait", type=float, default=0.0, help="mesh-restore: seconds to wait")
    parser.add_argument("--process", type=int, default=0, help="together: this process")
    parser.add_argument("--processes", type=int, default=2, help="together: how many")
    parser.add_argument("--port", type=int, default=0, help="together: the coordinator's")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    import numpy as np

    from jaxloops import checkpoint

    args = parse(argv)
    if args.out is not None:
        writable_file(args.out, "--out")  # before the run, not after it
    sizes = workers.sizes_from_json(args.sizes)
    if args.command == "together":
        (directory,) = args.runs
        train_together(directory, args.process, args.processes, args.port, args.epochs,
                       args.every, args.slow, sizes)  # fmt: skip
        # Meet once more, then leave without tearing down the coordinator (as chapter 12's
        # processes do: jax.distributed.shutdown() on CPU could abort it).
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("trained together")
        sys.stdout.flush()
        os._exit(0)
    workers.check_cpu_devices(args.devices)
    if args.command == "train":
        stop_at = args.epochs if args.stop_at is None else args.stop_at
        state, runs = {}, {}
        for i, run in enumerate(args.runs):
            model, _, directory = run.partition(":")
            if model not in runs:  # built once per model: one compiled train step each
                runs[model] = experiment(model, sizes, jax.devices("cpu")[0])
            try:
                state[str(i)] = train(
                    model,
                    runs[model],
                    directory,
                    stop_at,
                    args.keep_last,
                    args.slow,
                    args.every,
                    args.lost_at,
                )
            except Preempted:
                return 0  # saved: exit cleanly, as a cluster expects after SIGTERM
    else:
        (directory,) = args.runs
        state = mesh_save_or_restore(args.command, directory, args.devices, args.wait, sizes)
        print(json.dumps(mesh_report(state)), flush=True)
    if args.out is not None:
        np.savez(args.out, **checkpoint.flat_arrays(state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
