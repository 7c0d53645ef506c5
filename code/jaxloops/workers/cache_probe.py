"""Compiles the book's training program in a new process: `python -m jaxloops.workers.cache_probe`.

Started by `measure.compile_in_fresh_process` with `--sizes` (JSON of the parent's `loop`
part); prints {"seconds": ...}, the time from trace to executable of fit's compiled epochs
for the chapter-7 network. With JAX's persistent cache configured in its environment, a
second such process loads the executable instead of compiling it.
"""

import argparse
import json
import time

import jax

from jaxloops import workers


def compile_seconds(sizes, epochs: int = 3) -> float:
    """Seconds to trace, lower and compile `epochs` epochs of the digits MLP at `sizes` (a
    `LoopSizes`), in this process."""
    import jaxloops
    from jaxloops.loop import make_epochs

    split = jaxloops.load_digits_split(seed=0)
    train = jaxloops.to_device(split.train)
    params = jaxloops.init_mlp(jax.random.key(0), sizes.widths)
    optimizer = jaxloops.make_optimizer(sizes.learning_rate, sizes.weight_decay)
    step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
    program = jax.jit(make_epochs(step, sizes.batch_size, epochs))
    start = time.perf_counter()
    program.lower(params, optimizer.init(params), jax.random.key(1), 0, train).compile()
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", required=True, help="JSON of the parent's loop part")
    args = parser.parse_args(argv)
    sizes = workers.sizes_from_json(args.sizes).loop
    print(json.dumps({"seconds": compile_seconds(sizes)}), flush=True)


if __name__ == "__main__":
    main()
