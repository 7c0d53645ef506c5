"""The streaming run that chapter 15 and its tests kill mid-epoch and resume.

  python -m jaxloops.workers.streaming CHECKPOINTS --shards DIR --sizes JSON [--slow S]
      [--out f.npz]
      resumes from the newest checkpoint in CHECKPOINTS (if any: the model and the Grain
      iterator's position), trains the MLP of the `streaming` sizes on the shards in DIR to
      the end of the stream with batches prefetched to the device, saving every
      `save_every` steps; writes the final params and optimizer state to --out.

--sizes is `workers.sizes_json(streaming=sizes.streaming)`. The parent starts the process
with `workers.cpu_env(1)`. Each save prints "saved step S", flushed, so a parent can kill
the process between two saves.
"""

import argparse
import sys
import time

import jax

from jaxloops import workers
from jaxloops.paths import existing_directory, writable_directory, writable_file


def train(checkpoints, shards, sizes, slow: float = 0.0, log=print) -> tuple[int, dict]:
    """Resumes or starts the run, streams it to its end saving as it goes.

    Returns:
      (the step it started from, the final {"params", "opt_state"}).
    Raises:
      ValueError: a checkpoint directory that cannot be written, a shard directory that does
        not exist (naming the path), or a negative `slow`; before any work.
    """
    writable_directory(checkpoints, "checkpoint directory")
    existing_directory(shards, "shard directory")
    if slow < 0:
        raise ValueError(f"slow must be >= 0 seconds, got {slow}")
    # All of it on the CPU, the initialisation included: a parent on an accelerator that runs
    # this to compare with a worker process (on the CPU) then computes the same bits.
    with jax.default_device(jax.devices("cpu")[0]):
        return _train(checkpoints, shards, sizes, slow, log)


def _train(checkpoints, shards, sizes, slow, log) -> tuple[int, dict]:
    from jaxloops import stream_checkpoint, streaming

    device = jax.devices("cpu")[0]
    run = streaming.stream_run(shards, sizes)
    params, opt_state = jax.device_put(run.init(), device)
    iterator = streaming.prefetched(run.dataset, device)
    manager = stream_checkpoint.stream_manager(checkpoints, keep_last=3)
    batches = len(run.dataset)
    resumed = stream_checkpoint.restore_stream(
        manager, params, opt_state, iterator, run.fingerprint, batches
    )
    step = 0
    if resumed is not None:
        step, params, opt_state, iterator = resumed
    start = step
    log(f"starting at step {step} of {batches}")
    jitted = jax.jit(run.train_step, donate_argnums=(0, 1))
    for batch in iterator:
        params, opt_state, _ = jitted(params, opt_state, batch)
        step += 1
        if step % sizes.save_every == 0:
            stream_checkpoint.save_stream(
                manager, step, params, opt_state, iterator, run.fingerprint
            )
            log(f"saved step {step}")
            time.sleep(slow)  # a long run: leaves time to kill it between saves
    manager.wait_until_finished()
    manager.close()
    return start, {"params": params, "opt_state": opt_state}


def main(argv=None) -> int:
    import numpy as np

    from jaxloops import checkpoint

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints")
    parser.add_argument("--shards", required=True)
    parser.add_argument("--sizes", required=True, help="JSON of the streaming part")
    parser.add_argument("--slow", type=float, default=0.0, help="seconds to sleep per save")
    parser.add_argument("--out", default=None, help=".npz file for the final leaves")
    args = parser.parse_args(argv)
    if args.out is not None:
        writable_file(args.out, "--out")  # before the run, not after it
    workers.check_cpu_devices(1)
    sizes = workers.sizes_from_json(args.sizes).streaming
    log = lambda line: print(line, flush=True)
    _, state = train(args.checkpoints, args.shards, sizes, args.slow, log)
    if args.out is not None:
        np.savez(args.out, **checkpoint.flat_arrays(state))
    return 0


if __name__ == "__main__":
    sys.exit(main())
