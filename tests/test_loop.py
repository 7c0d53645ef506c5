import jax
import numpy as np
import pytest

import jaxloops
from jaxloops import measure


def test_scan_epoch_equals_the_step_by_step_loop(digits, key):
    params = jaxloops.init_mlp(key, (64, 13, 10))
    optimizer = jaxloops.make_optimizer(3e-3, 1e-3)
    train_step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
    batches = jaxloops.epoch_batches(key, digits.train, 101)

    scanned, _, metrics = jax.jit(jaxloops.make_epoch(train_step))(params, optimizer.init(params), batches)
    stepped, _, logged = jaxloops.python_loop(
        jax.jit(train_step), params, optimizer.init(params), jaxloops.unstack(batches), log_every=1
    )
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5), scanned, stepped)
    np.testing.assert_allclose(metrics["loss"], logged, rtol=2e-4)
    assert metrics["loss"].shape == (batches.x.shape[0],)


def test_python_loop_logs_every_k_steps(digits, key):
    params = jaxloops.init_mlp(key, (64, 5, 10))
    optimizer = jaxloops.make_optimizer(1e-3, 0.0)
    step = jax.jit(jaxloops.make_train_step(jaxloops.mlp_loss, optimizer))
    batches = jaxloops.unstack(jaxloops.epoch_batches(key, digits.train, 128))  # 10 batches
    _, _, logged = jaxloops.python_loop(step, params, optimizer.init(params), batches, log_every=3)
    assert len(logged) == 4  # steps 0, 3, 6, 9
    assert all(isinstance(v, float) for v in logged)
    with pytest.raises(ValueError, match="log_every"):
        jaxloops.python_loop(step, params, optimizer.init(params), batches, log_every=0)


def test_fit_compiles_the_epoch_once_and_learns(digits, key):
    params = jaxloops.init_mlp(key, (64, 32, 10))
    optimizer = jaxloops.make_optimizer(3e-3, 1e-4)
    train_step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
    with measure.count_compiles() as log:
        params, _, history = jaxloops.fit(key, params, optimizer.init(params), train_step, digits.train, 128, 3)
    assert log.names.count("jit(epoch)") == 1
    assert history["loss"].shape == (3,)
    assert history["loss"][-1] < history["loss"][0]
