"""A profiler trace, read without a UI: who was busy when, host and device, as spans.

`jax.profiler.trace` writes an XSpace protobuf (`*.xplane.pb`); `jax.profiler.ProfileData`
reads it as planes (a host, each device) of lines (threads, streams) of timed events.
`trace_spans` keeps four rows a training loop is made of:

- "host work": events named `HOST_WORK` (a `jax.profiler.TraceAnnotation` the caller opens);
- "dispatch": the Python thread (whatever the interpreter is called) calling a jitted
  function (`PjitFunction(...)`), which returns once the work is queued;
- "wait": the Python thread blocked on a result (`np.asarray(jax.Array)`: `float(loss)`);
- "device": compiled code executing. On a CPU backend these are the XLA CPU client's worker
  threads and its intra-op thread pool (the "device" is other threads of the same
  processor), one event per operation, best effort: small kernels run on the calling
  thread, and JAX 0.12's CPU client names no such threads; on a GPU or a TPU, the device
  plane's "XLA Modules" line, one event per program.

On a GPU or a TPU, the device plane's "XLA Ops" line also holds one event per operation the
program executed, named as the compiled program's HLO names it ("fusion.12",
"convolution.3"): those are kept as row `OP`, outside the four (the "device" row already
covers their time), for `device_op_seconds`.
"""

import dataclasses
import pathlib
import tempfile
from collections.abc import Callable
from typing import Any

import jax

HOST_WORK = "host work"
ROWS = (HOST_WORK, "dispatch", "wait", "device")
OP = "device op"  # an accelerator's operations, inside its "device" spans


@dataclasses.dataclass(frozen=True)
class Span:
    row: str  # one of ROWS, or OP
    name: str  # the event's own name
    start: float  # seconds since the first kept event
    end: float


# The events only the Python thread records. The trace names that thread after the
# executable ("python", "python3", "python3.12", a kernel's own name), so it is recognised
# by what it recorded, not by its name.
_PYTHON_EVENTS = (HOST_WORK, "np.asarray(jax.Array)")


def _is_python_line(line) -> bool:
    return any(e.name in _PYTHON_EVENTS or e.name.startswith("PjitFunction(") for e in line.events)


def _row(plane_name: str, line_name: str, event_name: str, python_line: bool) -> str | None:
    if plane_name.startswith("/device:"):  # GPU/TPU: one event per program, and per operation
        return {"XLA Modules": "device", "XLA Ops": OP}.get(line_name)
    if python_line:
        if event_name == HOST_WORK:
            return HOST_WORK
        if event_name.startswith("PjitFunction("):
            return "dispatch"
        if event_name == "np.asarray(jax.Array)":
            return "wait"
        return None
    if ("XLAPjRtCpuClient" in line_name or "XLAEigen" in line_name) and not event_name.startswith(
        ("ThreadpoolListener", "end: ", "ThunkExecutor", "SlinkyThreadPool")
    ):
        return "device"
    return None


def spans_of(profile) -> list[Span]:
    """The spans of a `jax.profiler.ProfileData`, sorted by start, times from the first one."""
    raw = []
    for plane in profile.planes:
        for line in plane.lines:
            python_line = not plane.name.startswith("/device:") and _is_python_line(line)
            for event in line.events:
                row = _row(plane.name, line.name, event.name, python_line)
                if row is not None:
                    raw.append((row, event.name, event.start_ns, event.end_ns))
    if not raw:
        return []
    origin = min(start for _, _, start, _ in raw)
    spans = [Span(r, n, (s - origin) * 1e-9, (e - origin) * 1e-9) for r, n, s, e in raw]
    spans.sort(key=lambda s: (s.start, s.row))
    # A jitted call is recorded twice, nested (C++ and Python frames): keep the outer one.
    kept, open_end = [], {}
    for span in spans:
        if span.start < open_end.get((span.row, span.name), float("-inf")):
            continue
        kept.append(span)
        open_end[(span.row, span.name)] = span.end
    return kept


def trace_spans(
    run: Callable[[], Any], log_dir: str | pathlib.Path | None = None, *, tries: int = 1
) -> list[Span]:
    """Runs `run()` under `jax.profiler.trace` (Python function tracing off) and returns the
    spans of the trace it wrote; waits for `run`'s result inside the trace.

    With `tries` > 1 it traces `run` that many times and keeps the shortest trace: as with
    timings, another process taking a core only makes a run longer, so the shortest is the
    least disturbed (on a 2-core CPU, a busy core can keep the Python thread off the
    processor while the step runs, and the trace then shows no overlap at all).
    """
    if tries < 1:
        raise ValueError(f"tries must be >= 1, got {tries}")
    traces = [_trace_once(run, log_dir) for _ in range(tries)]
    return min(traces, key=lambda spans: max((s.end for s in spans), default=0.0))


def _trace_once(run: Callable[[], Any], log_dir: str | pathlib.Path | None) -> list[Span]:
    """One trace of `run()`, read back as spans: the XSpace file `jax.profiler.trace` wrote."""
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # every Python call would be an event otherwise
    with tempfile.TemporaryDirectory() as tmp:
        directory = pathlib.Path(log_dir or tmp)
        with jax.profiler.trace(directory, profiler_options=options):
            jax.block_until_ready(run())
        files = sorted(directory.glob("**/*.xplane.pb"), key=lambda p: p.stat().st_mtime)
        if not files:
            raise RuntimeError(f"jax.profiler.trace wrote no *.xplane.pb under {directory}")
        return spans_of(jax.profiler.ProfileData.from_file(str(files[-1])))


def _busy_intervals(spans: list[Span], row: str) -> list[tuple[float, float]]:
    """The (start, end) intervals during which `row` was busy, overlapping spans merged."""
    merged: list[list[float]] = []
    for span in sorted((s for s in spans if s.row == row), key=lambda s: s.start):
        if merged and span.start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], span.end)
        else:
            merged.append([span.start, span.end])
    return [(start, end) for start, end in merged]


def busy_seconds(spans: list[Span], row: str) -> float:
    """Seconds during which at least one span of `row` was open (overlaps counted once)."""
    return sum(end - start for start, end in _busy_intervals(spans, row))


def overlap_seconds(spans: list[Span], row: str, other: str) -> float:
    """Seconds during which both `row` and `other` were busy."""
    others = _busy_intervals(spans, other)
    return sum(
        max(0.0, min(end, other_end) - max(start, other_start))
        for start, end in _busy_intervals(spans, row)
        for other_start, other_end in others
    )


def device_op_seconds(spans: list[Span], *, calls: int = 1) -> dict[str, float]:
    """Seconds per call in each compiled operation (a fusion, a custom call, a copy) that the
    trace names: an accelerator's "XLA Ops" (row `OP`) where the trace has them, else the
    CPU's "device" row; the spans of loops (`while...`), which contain their bodies'
    operations, and of whole programs (`jit_...`) are left out. Empty where the backend's
    trace names no operations (JAX 0.12's CPU client names none)."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    row = OP if any(span.row == OP for span in spans) else "device"
    seconds: dict[str, float] = {}
    for span in spans:
        if span.row == row and not span.name.startswith(("while", "jit_")):
            seconds[span.name] = seconds.get(span.name, 0.0) + (span.end - span.start) / calls
    return seconds


def blocked_share(spans: list[Span]) -> float:
    """Share of the traced time the Python thread was blocked on the device: in a wait, or
    in a dispatch (on a CPU backend the "device" shares the Python thread's cores)."""
    return (busy_seconds(spans, "wait") + busy_seconds(spans, "dispatch")) / max(
        s.end for s in spans
    )


def wait_count(spans: list[Span]) -> int:
    """How many times the Python thread waited for the device."""
    return sum(s.row == "wait" for s in spans)


def device_under_host_work(spans: list[Span]) -> float:
    """Share of the device's busy time during which the host was working too (0 if the
    trace names no device time)."""
    return overlap_seconds(spans, "device", HOST_WORK) / max(busy_seconds(spans, "device"), 1e-12)


def predicted_blocked_shares(
    host: float,
    device: float,
    every_step: float,
    never: float,
    *,
    fetched: float | None = None,
    dispatch: float = 0.0,
):
    """The blocked shares the overlap model predicts from its parts, h = `host`, d = `device`,
    d_f = `fetched` (default d) and c = `dispatch` (`predicted_step_seconds` names them), and
    the measured seconds per step of the fetch-every-step and never-fetch drivers.

    The overlap o is the share of the shorter work, of h + c and d, that ran beside the other
    without fetches: what never fetching saved against h + c + d, (every_step - r - never) /
    min(h + c, d), clipped to [0, 1], where r = d_f - c - d is what a fetch adds. Blocked,
    waiting or dispatching: d_f / (h + d_f) with a fetch every step; without fetches the
    calls and the part of the work that did not overlap, (c + a) / (max(h + c, d) + a) with
    a = (1 - o) min(h + c, d).

    Returns:
      {"overlap": o, "fetch every step": ..., "never fetch": ...}.
    """
    fetched = device if fetched is None else fetched
    busy = host + dispatch  # the host's part of a step it does not wait for
    round_trip = fetched - dispatch - device
    o = min(max((every_step - round_trip - never) / min(busy, device), 0.0), 1.0)
    alone = (1 - o) * min(busy, device)
    return {
        "overlap": o,
        "fetch every step": fetched / (host + fetched),
        "never fetch": (dispatch + alone) / (max(busy, device) + alone),
    }
