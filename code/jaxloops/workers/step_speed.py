"""The transformer's train step timed in a new process: `python -m jaxloops.workers.step_speed`.

Started by `measure.step_speed.rates_in_fresh_process` with `--sizes L,D,N,K,F,T,B` and `--rounds`,
in an environment chosen by the parent (the glibc tunables of one of
`step_speed.ALLOCATORS`); prints one JSON line:
`step_rates` of the step's programs and
"faults": minor page faults per train step (`page_faults`); with `--breakdown`, also
"groups": `step_breakdown` of the step.
"""

import argparse
import json

import jax

from jaxloops.measure import step_speed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", required=True, help="L,D,N,K,F,T,B")
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--breakdown", action="store_true", help="also the traced groups")
    args = parser.parse_args(argv)
    try:
        sizes = tuple(int(n) for n in args.sizes.split(","))
    except ValueError:
        parser.error(f"--sizes must be seven comma-separated ints, got {args.sizes!r}")
    programs = step_speed.step_programs(sizes, jax.random.key(3))
    rates = step_speed.step_rates(programs, args.rounds)
    result = {**rates, "faults": step_speed.page_faults(programs)}
    if args.breakdown:
        result["groups"] = step_speed.step_breakdown(programs)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
