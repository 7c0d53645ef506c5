"""measure/update_bytes.py: chapter 7's floor of bytes a parameter and its control."""

import pytest

from jaxloops.measure import update_bytes


def test_the_floor_counts_a_forward_read_and_the_update_s_reads_and_writes():
    # AdamW: the weight read forward (4), parameter and two moments read (12) and written (12)
    assert update_bytes.bytes_per_parameter("AdamW") == 28
    assert update_bytes.bytes_sum("AdamW") == "4 + 12 + 12"
    assert update_bytes.bytes_per_parameter("SGD") == 12
    assert update_bytes.bytes_sum("SGD") == "4 + 4 + 4"
    assert update_bytes.GRADIENT_BYTES == 8  # written by the backward pass, read by the update


def test_the_floor_is_bytes_over_bandwidth():
    # 1,000 parameters of AdamW at 28 kB/s: one second; a wrong count (SGD's) is not
    assert update_bytes.floor_seconds(1000, "AdamW", 28e3) == pytest.approx(1.0)
    assert update_bytes.floor_seconds(1000, "SGD", 28e3) != pytest.approx(1.0)


def test_the_step_a_goal_needs_is_the_dispatch_over_the_goal():
    assert update_bytes.step_needed(320e-6, 8) == pytest.approx(40e-6)


def test_a_run_s_step_is_its_median_over_its_steps():
    calls = {"a": 0}

    def run():
        calls["a"] += 1
        return 0

    per_step = update_bytes.seconds_per_step({"a": run}, steps=10, rounds=3)
    assert set(per_step) == {"a"} and 0 < per_step["a"] < 1e-3
    assert calls["a"] == 1 + 3 * 2  # one compile call, then a warm-up and a timed call a round


@pytest.mark.parametrize(
    "call, named",
    [
        (lambda: update_bytes.bytes_per_parameter("Adam"), "'Adam'"),
        (lambda: update_bytes.floor_seconds(0, "SGD", 1e9), "0"),
        (lambda: update_bytes.floor_seconds(10, "SGD", 0.0), "0.0"),
        (lambda: update_bytes.step_needed(-1.0, 8), "-1.0"),
        (lambda: update_bytes.seconds_per_step({}, steps=0), "0"),
    ],
)
def test_bad_input_is_refused_naming_the_value(call, named):
    with pytest.raises(ValueError, match=named):
        call()
