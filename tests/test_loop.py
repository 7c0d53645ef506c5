import functools

import jax
import numpy as np
import pytest

import jaxloops
from jaxloops import checkpoint, equivalence, measure, train

# One MLP for the module: its init and its optimizer states' zeros compile once, not per test.
WIDTHS = (64, 13, 10)
# The optimizer and step of the fit tests that need nothing else of their own: those that
# run the same epochs per call share one compiled program.
OPTIMIZER = jaxloops.make_optimizer(3e-3, 1e-4)
TRAIN_STEP = jaxloops.make_train_step(jaxloops.mlp_loss, OPTIMIZER)


def copy(tree):
    """A fresh device copy of every leaf (fit donates its arguments), through the host
    (jnp.copy would compile one program per leaf shape), committed to the leaf's device as
    restored arrays are: fit runs fresh and restored states with the same program."""
    return jax.tree.map(lambda a: jax.device_put(np.asarray(a), a.sharding), tree)


def host_unstack(batches):
    """`jaxloops.unstack` of the batches sliced on the host (eager indexing compiles a program
    per shape), each batch then put on the device."""
    return jax.device_put(jaxloops.unstack(jax.device_get(batches)))


def fresh(params, optimizer=OPTIMIZER):
    """Copies of `params` and a fresh optimizer state for them, for fit to donate."""
    return copy((params, optimizer.init(params)))


def test_scan_epoch_equals_the_step_by_step_loop(digits, key):
    params = jaxloops.init_mlp(key, WIDTHS)
    optimizer = jaxloops.make_optimizer(3e-3, 1e-3)
    train_step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
    batches = jaxloops.epoch_batches(key, digits.train, 101)

    scanned, _, metrics = jax.jit(jaxloops.make_epoch(train_step))(
        params, optimizer.init(params), batches
    )
    stepped, _, logged = jaxloops.python_loop(
        jax.jit(train_step), params, optimizer.init(params), host_unstack(batches), log_every=1
    )
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5), scanned, stepped
    )
    np.testing.assert_allclose(metrics["loss"], logged, rtol=2e-4)
    assert metrics["loss"].shape == (batches.x.shape[0],)


def test_python_loop_logs_every_k_steps(digits, key):
    params = jaxloops.init_mlp(key, WIDTHS)
    optimizer = jaxloops.make_optimizer(1e-3, 0.0)
    step = jax.jit(jaxloops.make_train_step(jaxloops.mlp_loss, optimizer))
    batches = jaxloops.unstack(jaxloops.epoch_batches(key, digits.train, 128))  # 10 batches
    _, _, logged = jaxloops.python_loop(step, params, optimizer.init(params), batches, log_every=3)
    assert len(logged) == 4  # steps 0, 3, 6, 9
    assert all(isinstance(v, float) for v in logged)
    with pytest.raises(ValueError, match="log_every"):
        jaxloops.python_loop(step, params, optimizer.init(params), batches, log_every=0)


def test_fit_compiles_once_and_a_second_call_compiles_nothing(digits, key):
    params = jaxloops.init_mlp(key, WIDTHS)
    optimizer = jaxloops.make_optimizer(3e-3, 1e-4)
    train_step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
    with measure.count_compiles() as first:
        params, opt_state, history = jaxloops.fit(
            key, params, optimizer.init(params), train_step, digits.train, batch_size=128, epochs=3
        )
    assert first.names.count("jit(epochs)") == 1
    assert history.train["loss"].shape == (3,)
    assert history.train["loss"][-1] < history.train["loss"][0]
    with measure.count_compiles() as second:
        jaxloops.fit(key, params, opt_state, train_step, digits.train, batch_size=128, epochs=3)
    assert second.count == 0


def test_fit_equals_the_step_by_step_loop(digits, key):
    """fit's compiled epochs are the same arithmetic as jitted steps over the same batches."""
    init = jaxloops.init_mlp(key, WIDTHS)
    optimizer = jaxloops.make_optimizer(1e-2, 1e-3)
    train_step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
    data_key = jax.random.key(3)
    # every leaf committed from the start, so that each program compiles once (a first call
    # with some uncommitted leaves returns committed ones, and the second would recompile)
    params, opt_state, history = jaxloops.fit(
        data_key,
        *fresh(init, optimizer),
        train_step,
        digits.train,
        batch_size=100,
        epochs=2,
        epochs_per_call=1,
    )
    step = jax.jit(train_step)
    (ref_params, ref_state), losses = fresh(init, optimizer), []
    for epoch in range(2):
        batches = jaxloops.epoch_batches(jax.random.fold_in(data_key, epoch), digits.train, 100)
        for batch in host_unstack(batches):
            ref_params, ref_state, metrics = step(ref_params, ref_state, batch)
            losses.append(float(metrics["loss"]))
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(
        history.train["loss"], np.mean(np.reshape(losses, (2, -1)), axis=1), rtol=1e-5
    )


def test_fit_resumed_at_an_epoch_equals_the_uninterrupted_run(digits, key):
    init = jaxloops.init_mlp(key, WIDTHS)
    whole, _, _ = jaxloops.fit(
        key, *fresh(init), TRAIN_STEP, digits.train, batch_size=128, epochs=4, epochs_per_call=2
    )
    half, state, _ = jaxloops.fit(
        key, *fresh(init), TRAIN_STEP, digits.train, batch_size=128, epochs=2, epochs_per_call=2
    )
    resumed, _, _ = jaxloops.fit(
        key,
        half,
        state,
        TRAIN_STEP,
        digits.train,
        batch_size=128,
        epochs=4,
        epochs_per_call=2,
        start_epoch=2,
    )
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(resumed)):
        np.testing.assert_array_equal(a, b)


def test_fit_calls_its_hook_after_each_call_and_records_what_it_returns(digits, key):
    params = jaxloops.init_mlp(key, WIDTHS)
    optimizer = jaxloops.make_optimizer(3e-3, 0.0)
    train_step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
    seen = []

    def hook(epoch, params, opt_state):
        seen.append(epoch)
        return {"w_norm": float(np.linalg.norm(params["dense_0"]["w"]))} if epoch % 2 == 0 else None

    _, _, history = jaxloops.fit(
        key,
        params,
        optimizer.init(params),
        train_step,
        digits.train,
        batch_size=128,
        epochs=5,
        epochs_per_call=1,
        hook=hook,
    )
    assert seen == [1, 2, 3, 4, 5]
    assert [epoch for epoch, _ in history.hooks] == [2, 4]
    assert history.train["loss"].shape == (5,)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(batch_size=0, epochs=1), "batch size 0"),
        (dict(batch_size=128, epochs=2, start_epoch=3), "start_epoch 3"),
        (dict(batch_size=128, epochs=2, epochs_per_call=0), "epochs_per_call"),
        (dict(batch_size=128, epochs=0), "epochs must be >= 1, got 0"),
    ],
)
def test_fit_rejects_bad_arguments_by_name(digits, key, kwargs, match):
    params = jaxloops.init_mlp(key, WIDTHS)
    optimizer = jaxloops.make_optimizer(3e-3, 0.0)
    train_step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
    with pytest.raises(ValueError, match=match):
        jaxloops.fit(key, params, optimizer.init(params), train_step, digits.train, **kwargs)


def test_fit_ends_the_run_when_its_hook_says_stop(digits, key):
    params = jaxloops.init_mlp(key, WIDTHS)
    hook = lambda epoch, params, opt_state: {"epoch": epoch, "stop": epoch == 4}
    # two epochs a call from a fresh state, as the resume test: the same compiled program
    _, opt_state, history = jaxloops.fit(
        key, *fresh(params), TRAIN_STEP, digits.train, batch_size=128,
        epochs=9, epochs_per_call=2, hook=hook,
    )  # fmt: skip
    assert [epoch for epoch, _ in history.hooks] == [2, 4]
    assert history.train["loss"].shape == (4,)
    assert int(train.step_count(opt_state)) == 4 * (digits.train.x.shape[0] // 128)


def test_a_run_with_dropout_resumed_from_a_checkpoint_is_bit_identical(digits, key, tmp_path):
    """Saved with jaxloops.checkpoint (orbax) after epoch 2 of 4, restored, finished: the
    masks of step t come from fold_in(key, t) and t from the restored optimizer state."""
    init = jaxloops.init_mlp(key, WIDTHS)
    loss = functools.partial(jaxloops.mlp_loss, dropout_rate=0.3)
    train_step = train.make_keyed_train_step(loss, OPTIMIZER)
    data_key, dropout_key = jax.random.key(3), jax.random.key(4)
    run = functools.partial(
        jaxloops.fit, data_key, train_step=train_step, data=digits.train, batch_size=128,
        epochs_per_call=1, step_key=dropout_key,
    )  # fmt: skip
    whole, _, _ = run(*fresh(init), epochs=4)
    manager = checkpoint.checkpoint_manager(tmp_path, keep_last=1)
    run(*fresh(init), epochs=2, hook=checkpoint.checkpoint_hook(manager, data_key))
    manager.wait_until_finished()
    back = checkpoint.restore_latest(manager, data_key, *fresh(init))
    assert back.epoch == 2
    resumed, _, _ = run(back.params, back.opt_state, epochs=4, start_epoch=back.epoch)
    flat = lambda tree: checkpoint.flat_arrays({"params": tree})
    assert equivalence.differing(flat(resumed), flat(whole)) == []
    # The check can fail: a resume that draws its masks from another key ends elsewhere.
    back = checkpoint.restore_latest(manager, data_key, *fresh(init))
    other = run(back.params, back.opt_state, epochs=4, start_epoch=2, step_key=jax.random.key(5))
    assert equivalence.differing(flat(other[0]), flat(whole)) != []
