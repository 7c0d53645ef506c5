import jax
import numpy as np

import jaxloops
from jaxloops import measure
from jaxloops.measure import random_batches, scan_throughput


def _step(key):
    params = jaxloops.init_mlp(key, (5, 7, 3))
    optimizer = jaxloops.make_optimizer(1e-3, 1e-4)
    return jaxloops.make_train_step(jaxloops.mlp_loss, optimizer), params, optimizer.init(params)


def test_scan_flops_per_step_equal_the_steps_own_cost_analysis(key):
    train_step, params, opt_state = _step(key)
    batches = random_batches(key, 11, 13, 5, 3)
    row = scan_throughput(train_step, params, opt_state, batches, repeats=1)
    one = jax.tree.map(lambda a: a[0], batches)
    per_step = measure.compiled_flops(train_step, params, opt_state, one)
    np.testing.assert_allclose(row["flops_per_step"], per_step, rtol=0.01)
    assert row["batch_size"] == 13
    np.testing.assert_allclose(row["examples_per_s"], 13 * row["steps_per_s"])
