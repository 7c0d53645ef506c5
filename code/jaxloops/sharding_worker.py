"""One process of a multi-process data-parallel run: `python -m jaxloops.sharding_worker`.

Launched once per process by `jaxloops.sharding.run_processes`; on a real cluster the same
program is started once per host by its scheduler (Slurm, Kubernetes, a TPU pod's runtime).
"""

import argparse
import os
import sys

import jax
from jax.experimental import multihost_utils


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--process", type=int, required=True)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--devices", type=int, required=True, help="CPU devices per process")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    # Before the backend starts: this process's devices, and how CPUs talk to each other.
    jax.config.update("jax_num_cpu_devices", args.devices)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"localhost:{args.port}",
        num_processes=args.processes,
        process_id=args.process,
    )
    import dataclasses

    import numpy as np

    import jaxloops
    from jaxloops import sharding

    sizes = dataclasses.replace(jaxloops.experiment_sizes("cpu").sharding, epochs=args.epochs)
    mesh = sharding.data_mesh(jax.device_count())  # all processes' devices
    split = jaxloops.load_digits_split(seed=0)
    examples = sizes.examples
    per_process = examples // args.processes
    mine = slice(args.process * per_process, (args.process + 1) * per_process)
    local = jaxloops.Batch(split.train.x[:examples][mine], split.train.y[:examples][mine])
    params, _, history = sharding.fit_data_parallel(jax.random.key(0), mesh, local, examples, sizes)
    if args.process == 0:
        flat = {
            jax.tree_util.keystr(path): np.asarray(leaf.addressable_data(0))
            for path, leaf in jax.tree_util.tree_leaves_with_path(params)
        }
        flat["loss"] = history.train["loss"]
        np.savez(f"{args.out}/params.npz", **flat)
    # Every process has its results: meet once more, then leave without tearing down the
    # coordinator's gRPC server (jax.distributed.shutdown() on CPU aborted the coordinator now
    # and then when the other process's requests were still queued: seen in CI, JAX 0.10.2).
    multihost_utils.sync_global_devices("results written")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
