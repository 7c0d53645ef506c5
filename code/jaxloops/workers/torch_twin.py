"""The train step against its PyTorch twin, in a plain process: `python -m
jaxloops.workers.torch_twin --sizes L,D,N,K,F,T,B --rounds R`.

Started by `measure.torch_twin.rates_in_fresh_process` in `torch_twin.plain_env` (no
allocator variables but those it asks for, JAX on the CPU); prints one JSON line:
`torch_twin.paired_rates`.
Needs torch (requirements-bench.txt).
"""

import argparse
import json

import jax

from jaxloops.measure import torch_twin


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", required=True, help="L,D,N,K,F,T,B")
    parser.add_argument("--rounds", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        sizes = tuple(int(n) for n in args.sizes.split(","))
    except ValueError:
        parser.error(f"--sizes must be seven comma-separated ints, got {args.sizes!r}")
    print(json.dumps(torch_twin.paired_rates(sizes, jax.random.key(3), args.rounds)), flush=True)


if __name__ == "__main__":
    main()
