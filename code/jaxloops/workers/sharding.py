"""One process of a multi-process data-parallel run: `python -m jaxloops.workers.sharding`.

Launched once per process by `jaxloops.sharding.run_processes`, on the CPU platform with
`--devices` devices (`workers.cpu_env`) and the chapter's sizes (`--sizes`, JSON of its
`sharding` part); on a real cluster the same program is started once per host by its
scheduler (Slurm, Kubernetes, a TPU pod's runtime).
"""

import argparse
import os
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxloops import workers


def process_rows(examples: int, process: int, processes: int) -> slice:
    """This process's rows of the first `examples` training rows: an equal, contiguous part."""
    if examples % processes:
        raise ValueError(f"{examples} examples do not split evenly over {processes} processes")
    per_process = examples // processes
    return slice(process * per_process, (process + 1) * per_process)


def train(process: int, processes: int, sizes):
    """Trains data parallel over every process's CPU devices; this process feeds its rows.

    Returns:
      (params, opt_state, History): replicated on every device of the mesh.
    """
    import jaxloops
    from jaxloops import sharding

    mesh = sharding.data_mesh(jax.device_count("cpu"), jax.devices("cpu"))  # all processes'
    split = jaxloops.load_digits_split(seed=0)
    mine = process_rows(sizes.examples, process, processes)
    x, y = split.train.x[: sizes.examples], split.train.y[: sizes.examples]
    local = jaxloops.Batch(x[mine], y[mine])
    key = jax.random.key(0)
    params, opt_state, history = sharding.fit_data_parallel(key, mesh, local, sizes.examples, sizes)
    return params, opt_state, history


def save_together(directory, params, opt_state, epoch: int) -> None:
    """Every process calls this: one orbax checkpoint of the replicated state, written
    together (each array once, by the process that holds its first copy)."""
    from jaxloops import checkpoint, sharding

    mesh = params["dense_0"]["w"].sharding.mesh
    key_data = sharding.place(mesh, jax.P(), jax.random.key_data(jax.random.key(0)))
    manager = checkpoint.checkpoint_manager(directory, keep_last=1)
    save = checkpoint.checkpoint_hook(manager, jax.random.wrap_key_data(key_data))
    save(epoch, params, opt_state)
    manager.wait_until_finished()
    manager.close()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--process", type=int, required=True)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--devices", type=int, required=True, help="CPU devices per process")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--sizes", required=True, help="JSON of the chapter's sharding part")
    parser.add_argument("--out", required=True)
    parser.add_argument("--checkpoint", default=None, help="directory: save the state together")
    args = parser.parse_args(argv)

    # Before the backend starts: how CPUs talk to each other across processes.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"localhost:{args.port}",
        num_processes=args.processes,
        process_id=args.process,
    )
    from jaxloops import checkpoint

    workers.check_cpu_devices(args.devices)
    sizes = workers.sizes_from_json(args.sizes).sharding
    params, opt_state, history = train(args.process, args.processes, sizes)
    if args.checkpoint is not None:
        save_together(args.checkpoint, params, opt_state, sizes.epochs)
    if args.process == 0:
        flat = checkpoint.flat_arrays(params)
        flat |= checkpoint.flat_arrays({"opt_state": opt_state})
        np.savez(f"{args.out}/params.npz", loss=history.train["loss"], **flat)
    # Every process has its results: meet once more, then leave without tearing down the
    # coordinator's gRPC server (jax.distributed.shutdown() on CPU aborted the coordinator now
    # and then when the other process's requests were still queued: seen in CI, JAX 0.10.2).
    multihost_utils.sync_global_devices("results written")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
