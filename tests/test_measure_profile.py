import json
import pathlib
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxloops import measure, workers
from jaxloops.measure import profile
from jaxloops.measure.profile import HOST_WORK, Span


def test_busy_seconds_counts_overlapping_spans_once():
    spans = [
        Span("device", "a", 0.0, 2.0),
        Span("device", "b", 1.0, 3.0),
        Span("device", "c", 5.0, 6.0),
        Span("wait", "w", 0.0, 10.0),
    ]
    assert measure.busy_seconds(spans, "device") == 4.0
    assert measure.busy_seconds(spans, "dispatch") == 0.0


def test_a_trace_shows_host_work_dispatches_and_waits():
    matmul = jax.jit(lambda a: jnp.tanh(a @ a))
    a = jax.device_put(np.ones((64, 64), np.float32))  # no program compiled to make it
    matmul(a).block_until_ready()

    def run():
        x = a
        for _ in range(3):
            with jax.profiler.TraceAnnotation(HOST_WORK):
                time.sleep(0.002)
            x = matmul(x)
            float(x[0, 0])  # a fetch: the host waits
        return x

    spans = measure.trace_spans(run)
    rows = {row: [s for s in spans if s.row == row] for row in ("host work", "dispatch", "wait")}
    assert len(rows["host work"]) == 3
    assert sum(s.name == "PjitFunction(<lambda>)" for s in rows["dispatch"]) == 3
    assert len(rows["wait"]) == 3
    # The CPU "device" row is best effort: worker-thread names differ between XLA releases
    # (JAX 0.12's CPU client records none), and small kernels run on the calling thread.
    assert measure.busy_seconds(spans, HOST_WORK) >= 3 * 0.002
    assert all(s.end >= s.start >= 0 for s in spans)


def test_device_op_seconds_sums_each_operation_per_call():
    spans = [
        Span("device", "dot.1", 0.0, 3.0),
        Span("device", "dot.1", 4.0, 7.0),
        Span("device", "exp", 3.0, 4.0),
        Span("device", "while.5", 0.0, 7.0),  # a loop's span contains its body's: left out
        Span("device", "jit_step", 0.0, 7.0),  # a whole program (a GPU's module): left out
        Span("dispatch", "dot.1", 0.0, 9.0),  # not the device row
    ]
    assert measure.device_op_seconds(spans, calls=2) == {"dot.1": 3.0, "exp": 0.5}
    with pytest.raises(ValueError, match="calls must be >= 1, got 0"):
        measure.device_op_seconds(spans, calls=0)


def test_an_accelerator_trace_gives_its_operations_from_the_xla_ops_line():
    """A device plane as a TPU's trace writes it: a program on "XLA Modules", its operations
    on "XLA Ops". The program is the "device" row; the operations are what
    `device_op_seconds` sums (the module line alone named no operation, and the chip's
    breakdown came out empty)."""
    from types import SimpleNamespace as Fake

    event = lambda name, start, end: Fake(name=name, start_ns=start, end_ns=end)
    device = Fake(name="/device:TPU:0", lines=[
        Fake(name="XLA Modules", events=[event("jit_step(123)", 0, 10_000)]),
        Fake(name="XLA Ops", events=[event("convolution.3", 0, 6_000),
                                     event("fusion.12", 6_000, 9_000),
                                     event("convolution.3", 9_000, 10_000)]),
        Fake(name="Steps", events=[event("0", 0, 10_000)]),
    ])  # fmt: skip
    spans = profile.spans_of(Fake(planes=[device]))
    assert [s.row for s in spans].count("device") == 1
    assert measure.busy_seconds(spans, "device") == pytest.approx(1e-5)
    seconds = measure.device_op_seconds(spans)
    assert seconds == pytest.approx({"convolution.3": 7e-6, "fusion.12": 3e-6})
    modules_only = [s for s in spans if s.row == "device"]  # the old reading: no operation
    assert measure.device_op_seconds(modules_only) == {}


def test_overlap_seconds_counts_time_both_rows_were_busy():
    spans = [
        Span("device", "a", 0.0, 2.0),
        Span("device", "b", 1.0, 3.0),  # merged with a: busy 0-3
        Span("device", "c", 5.0, 6.0),
        Span(HOST_WORK, "h", 2.5, 5.5),
    ]
    assert measure.overlap_seconds(spans, "device", HOST_WORK) == 1.0  # 2.5-3 and 5-5.5
    assert measure.overlap_seconds(spans, "device", "wait") == 0.0


def test_trace_spans_keeps_the_shortest_of_its_tries():
    sleeps = iter([0.2, 0.005, 0.1])  # far apart: a busy machine oversleeps by milliseconds

    def run():
        with jax.profiler.TraceAnnotation(HOST_WORK):
            time.sleep(next(sleeps))
        return jnp.zeros(())

    spans = measure.trace_spans(run, tries=3)
    assert 0.005 <= measure.busy_seconds(spans, HOST_WORK) < 0.1
    with pytest.raises(ValueError, match="tries must be >= 1, got 0"):
        measure.trace_spans(run, tries=0)


_TRACE_IN_A_CHILD = """
import json, time, jax, jax.numpy as jnp
from jaxloops import measure, workers
from jaxloops.measure import profile
step = jax.jit(lambda a: a + 1)
x = step(jnp.ones(3))
def run():
    with jax.profiler.TraceAnnotation(profile.HOST_WORK):
        time.sleep(0.001)
    return float(step(x)[0])
names = []
original = profile.spans_of
def spans_of(data):
    names.extend(line.name for plane in data.planes for line in plane.lines
                 if profile._is_python_line(line))
    return original(data)
profile.spans_of = spans_of
spans = measure.trace_spans(run)
print(json.dumps({"python_lines": names, "rows": sorted({s.row for s in spans})}))
"""


def test_the_host_thread_is_found_when_the_interpreter_is_called_python3():
    # A reader's kernel, or the GPU machine, runs `python3`: the trace names the thread so.
    python3 = pathlib.Path(sys.executable).with_name("python3")
    if not python3.exists():
        pytest.skip(f"no {python3} beside this interpreter")
    # On the CPU: a TPU chip that this process holds cannot be opened by a second one.
    done = subprocess.run(
        [str(python3), "-c", _TRACE_IN_A_CHILD],
        capture_output=True,
        text=True,
        check=False,
        env=workers.cpu_env(1),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["python_lines"] and "python" not in found["python_lines"], found
    assert {HOST_WORK, "dispatch", "wait"} <= set(found["rows"]), found


def test_blocked_share_waits_and_overlap_of_a_known_trace():
    spans = [
        measure.Span(HOST_WORK, "h", 0.0, 2.0),
        measure.Span("dispatch", "d", 2.0, 3.0),
        measure.Span("wait", "w", 3.0, 5.0),
        measure.Span("wait", "w", 7.0, 8.0),
        measure.Span("device", "x", 1.0, 4.0),  # 1 s of it beside the host work
    ]
    assert measure.blocked_share(spans) == (1.0 + 3.0) / 8.0
    assert measure.wait_count(spans) == 2
    assert measure.device_under_host_work(spans) == 1.0 / 3.0
    assert measure.device_under_host_work(spans[:4]) == 0.0  # a trace without device time


def test_predicted_blocked_shares_follow_the_overlap_model():
    # h = 3, d = 2: the never-fetch driver saved 1 s of the 2 s that could overlap: o = 0.5.
    p = measure.predicted_blocked_shares(host=3.0, device=2.0, every_step=5.0, never=4.0)
    assert p == {"overlap": 0.5, "fetch every step": 2.0 / 5.0, "never fetch": 1.0 / 4.0}
    full = measure.predicted_blocked_shares(host=3.0, device=2.0, every_step=5.0, never=1.0)
    assert full["overlap"] == 1.0 and full["never fetch"] == 0.0  # clipped to full overlap


def test_predicted_blocked_shares_count_the_calls_and_leave_the_round_trip_out_of_the_overlap():
    # h = 3, c = 1, d = 2, d_f = 5 (a round trip of 2): fetching every step took h + d_f = 8,
    # never fetching h + c = 4, full overlap. The host is blocked in its calls: 1 s of 4.
    p = measure.predicted_blocked_shares(
        host=3.0, device=2.0, every_step=8.0, never=4.0, fetched=5.0, dispatch=1.0
    )
    assert p == {"overlap": 1.0, "fetch every step": 5.0 / 8.0, "never fetch": 1.0 / 4.0}
    # Never fetching 5 s: 1 s of the 2 s that could overlap did not, nor does the round trip.
    half = measure.predicted_blocked_shares(
        host=3.0, device=2.0, every_step=8.0, never=5.0, fetched=5.0, dispatch=1.0
    )
    assert half["overlap"] == 0.5 and half["never fetch"] == (1.0 + 1.0) / (4.0 + 1.0)
