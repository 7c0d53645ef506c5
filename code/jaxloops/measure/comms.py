"""Communication read from a compiled program: collectives per step, the bytes a ring sends,
the passes over the parameters, and the critical batch they give (chapter 12).

A collective inside a while loop (a scanned layer) runs once per trip: `per_step` multiplies
it by the loop's trip count. A ring of n devices sends, from each device, (n - 1) / n of an
all-gather's result, (n - 1) times a reduce-scatter's result (its input is n times larger),
and 2 (n - 1) / n of an all-reduce's.
"""

import re

import numpy as np

from jaxloops.measure.compiled import (
    COLLECTIVE,
    SHAPE,
    dtype_bytes,
    hlo_lines,
    loop_computations,
    program_text,
    shape_dims,
)

_REDUCTIONS = ("all-reduce", "reduce-scatter")
_RING_SHARE = {  # bytes a ring sends per device, per byte of one device's result
    "all-gather": lambda n: (n - 1) / n,
    "reduce-scatter": lambda n: n - 1,
    "all-reduce": lambda n: 2 * (n - 1) / n,
}


def _ops(program):
    """(computation, kind, result bytes, op_name) of each collective of a compiled program."""
    text = program_text(program)
    for computation, line in hlo_lines(text):
        for result, kind in COLLECTIVE.findall(line):
            size = sum(
                int(np.prod(shape_dims(d))) * dtype_bytes(t) for t, d in SHAPE.findall(result)
            )
            name = re.search(r'op_name="([^"]*)"', line)
            yield computation, kind, size, name.group(1) if name else ""


def _backward(kind: str, op_name: str, in_reducing_loop: bool) -> bool:
    """Autodiff names the backward pass's ops transpose(...) and the forward's jvp(...); an op
    it did not name (a custom_vjp's, a shard_map's) is backward if it reduces, or if it
    gathers in the loop that reduces gradients."""
    if "transpose(" in op_name:
        return True
    if "jvp(" in op_name:
        return False
    return kind in _REDUCTIONS or in_reducing_loop


def per_step(program, trips: int = 1, only_bytes=None) -> dict[str, dict[str, tuple[int, int]]]:
    """Collectives one step runs, by phase: {"forward"|"backward": {kind: (ops, bytes)}}.

    An op in a loop body (a scanned layer) counts `trips` times. Its phase is read from the
    op's name in the program's metadata (see `_backward`). `only_bytes`: count only the ops
    whose result has exactly that many bytes (one activation's, say).
    """
    if trips < 1:
        raise ValueError(f"trips must be >= 1, got {trips}")
    loops = loop_computations(program_text(program))
    ops = list(_ops(program))
    reducing = {c for c, kind, _, name in ops if kind in _REDUCTIONS and c in loops}
    found = {"forward": {}, "backward": {}}
    for computation, kind, size, name in ops:
        if only_bytes is not None and size != only_bytes:
            continue
        times = trips if computation in loops else 1
        backward = _backward(kind, name, computation in reducing)
        phase = found["backward" if backward else "forward"]
        count, total = phase.get(kind, (0, 0))
        phase[kind] = (count + times, total + times * size)
    return found


_ASYNC = re.compile(
    r" (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)-start\("
)


def async_collectives(program) -> list[str]:
    """The kinds of collective that a compiled program (or its HLO text) runs as a
    `-start`/`-done` pair, the form in which XLA overlaps one with other work; sorted."""
    return sorted(set(_ASYNC.findall(program_text(program))))


def ring_bytes(counted: dict[str, tuple[int, int]], n: int) -> float:
    """Bytes each of n devices sends for collectives {kind: (ops, result bytes)}, as a ring."""
    unknown = set(counted) - set(_RING_SHARE)
    if unknown:
        raise ValueError(f"no ring formula for {sorted(unknown)}")
    return sum(_RING_SHARE[kind](n) * total for kind, (_, total) in counted.items())


def passes(program, param_bytes: int, n: int, trips: int = 1) -> dict[str, float]:
    """Passes over the parameters per phase: ring bytes sent / ((n - 1) / n of their bytes).

    An all-gather or a reduce-scatter of every parameter is one pass, an all-reduce two.
    """
    one_pass = (n - 1) / n * param_bytes
    return {
        phase: ring_bytes(counted, n) / one_pass
        for phase, counted in per_step(program, trips).items()
    }


def critical_batch(flops_per_s: float, bytes_per_s: float, forward: float, backward: float):
    """Examples (or tokens) per device above which compute hides communication, in bf16.

    As the scaling book derives it: per example and device a step computes 2 P FLOPs
    forward and 4 P backward; a pass over the P parameters sends 2 P bytes (bf16). What a
    phase sends can hide only behind that phase's compute, so each phase needs
    B / n >= passes * 2 P / W / (FLOPs * P / C):

      forward  B / n >= forward * C / W;  backward  B / n >= backward / 2 * C / W.

    Data parallel (backward: one all-reduce, 2 passes) and FSDP (forward: a gather;
    backward: a gather and a reduce-scatter) both give C / W.
    """
    if min(forward, backward) < 0 or flops_per_s <= 0 or bytes_per_s <= 0:
        raise ValueError(
            f"need passes >= 0 and positive rates, got {forward}, {backward}, "
            f"{flops_per_s}, {bytes_per_s}"
        )
    return flops_per_s / bytes_per_s * max(forward, backward / 2)


def phase_times(per_device_batch, flops_per_s, bytes_per_s, *, flops: int, passes: float):
    """One phase's compute and communication seconds per parameter, at each examples-per-
    device: `flops` per parameter and example (2 forward, 4 backward) at the peak, and
    `passes` over the parameters of 2 bytes each (bf16) at the link's bytes/s.

    Returns:
      (compute, comms): arrays like `per_device_batch`; comms does not depend on it.
    """
    batch = np.asarray(per_device_batch, dtype=np.float64)
    compute = flops * batch / flops_per_s
    return compute, np.full_like(batch, 2 * passes / bytes_per_s)


def plot_phases(
    ax, per_device_batch, phases: dict, critical: float, title: str, critical_name="B/n"
) -> None:
    """One strategy's roofline: each phase's compute and communication time against the
    examples per device (or the x that `critical_name` names), and the critical value as a
    vertical line."""
    for (phase, (compute, comms)), color in zip(phases.items(), ("C0", "C1"), strict=False):
        ax.loglog(per_device_batch, compute, color=color, label=f"{phase}: compute")
        ax.loglog(per_device_batch, comms, color=color, ls="--", label=f"{phase}: communication")
    ax.axvline(
        critical, color="k", lw=0.8, ls=":", label=f"critical {critical_name} = {critical:,.0f}"
    )
    ax.set(title=title, xlabel="examples per device, B / n", ylabel="seconds per parameter")
    ax.legend(fontsize=7)


def crossover(per_device_batch, compute, comms) -> float:
    """Where the compute curve first reaches the communication curve (linear interpolation
    between the two grid points around it); inf if it never does."""
    x, gap = (np.asarray(a, np.float64) for a in (per_device_batch, np.subtract(compute, comms)))
    above = np.flatnonzero(gap >= 0)
    if above.size == 0:
        return float("inf")
    i = int(above[0])
    if i == 0:
        return float(x[0])
    return float(x[i - 1] - gap[i - 1] * (x[i] - x[i - 1]) / (gap[i] - gap[i - 1]))


def critical_width(
    flops_per_s: float, bytes_per_s: float, model: int, forward: float, backward: float
) -> float:
    """Hidden width F above which a Megatron MLP layer's compute hides its activation
    all-reduces over a `model` axis of m devices, in bf16, per token.

    Per token and device, the layer's two products compute 4 D F / m FLOPs forward and
    8 D F / m backward; each all-reduce of the (D,) activation sends 2 (m - 1) / m * 2 D
    bytes around a ring. `forward` and `backward` all-reduces per layer (read from the
    compiled program) hide when F >= reductions * (m - 1) * C / W, halved for the backward.
    The batch cancels: activations grow with it as compute does.
    """
    if model < 1 or min(forward, backward) < 0 or flops_per_s <= 0 or bytes_per_s <= 0:
        raise ValueError(
            f"need model >= 1, all-reduces >= 0 and positive rates, got {model}, {forward}, "
            f"{backward}, {flops_per_s}, {bytes_per_s}"
        )
    return (model - 1) * flops_per_s / bytes_per_s * max(forward, backward / 2)


def width_times(widths, flops_per_s, bytes_per_s, model: int, *, flops: int, reductions: float):
    """One phase of a tensor-parallel layer, per token and per unit of D: compute seconds at
    each hidden width F (`flops` per weight: 4 forward, 8 backward, split m ways) and the
    seconds of its `reductions` activation all-reduces, which do not depend on F.

    `phase_times` with F / m for the batch: a ring all-reduce of D bf16 numbers sends
    2 (m - 1) / m passes of them."""
    width = np.asarray(widths, dtype=np.float64) / model
    passes = reductions * 2 * (model - 1) / model
    return phase_times(width, flops_per_s, bytes_per_s, flops=flops, passes=passes)
