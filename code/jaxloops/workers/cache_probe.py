"""Compiles the book's training program in a new process: `python -m jaxloops.workers.cache_probe`.

Started by `measure.compile_in_fresh_process` with `--sizes` (JSON of the parent's `loop`
part); prints {"seconds": ...}, the time from trace to executable of fit's compiled epochs
for the chapter-7 network. With JAX's persistent cache configured in its environment, a
second such process loads the executable instead of compiling it.

With `--callback`, it compiles instead one small program with a host callback
(`jax.debug.print`) and the same program without it, and prints what the persistent cache
counted for each: {"callback": {"requests", "hits", "writes"}, "plain": {...}}.
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


# JAX's events for the persistent cache: a compile that may use it, a load, a store.
CACHE_EVENTS = {
    "/jax/compilation_cache/compile_requests_use_cache": "requests",
    "/jax/compilation_cache/cache_hits": "hits",
    "/jax/compilation_cache/cache_misses": "writes",  # recorded as an entry is written
}


def callback_cache_counts() -> dict[str, dict[str, int]]:
    """What the persistent cache counted while one program with a host callback, and the
    same program without it (the control), were compiled in this process."""
    import numpy as np

    def plain(x):
        return (x * 2.0).sum()

    def with_callback(x):
        jax.debug.print("sum {}", x.sum())  # a host callback inside the compiled program
        return plain(x)

    x = np.arange(7.0, dtype=np.float32)  # NumPy: nothing compiled to make it
    counts = {}
    for name, fn in (("callback", with_callback), ("plain", plain)):
        seen = dict.fromkeys(CACHE_EVENTS.values(), 0)

        def listener(event, seen=seen, **kwargs):  # this program's counts, bound now
            if event in CACHE_EVENTS:
                seen[CACHE_EVENTS[event]] += 1

        jax.monitoring.register_event_listener(listener)
        try:
            jax.jit(fn).lower(x).compile()
        finally:
            jax.monitoring.unregister_event_listener(listener)
        counts[name] = seen
    return counts


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", help="JSON of the parent's loop part")
    parser.add_argument("--callback", action="store_true", help="the host-callback probe")
    args = parser.parse_args(argv)
    if args.callback:
        print(json.dumps(callback_cache_counts()), flush=True)
        return
    if args.sizes is None:
        parser.error("--sizes is required without --callback")
    sizes = workers.sizes_from_json(args.sizes).loop
    print(json.dumps({"seconds": compile_seconds(sizes)}), flush=True)


if __name__ == "__main__":
    main()
