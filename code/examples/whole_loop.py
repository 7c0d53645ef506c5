"""The whole training loop on one screen. It imports nothing from jaxloops: copy it, run it."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

BATCH, WIDTHS = 128, (64, 256, 256, 10)  # the MLP of chapters 3-7: 64 pixels in, 10 classes out
decay_weights = lambda params: jax.tree.map(lambda a: a.ndim == 2, params)  # not the biases
optimizer = optax.adamw(3e-3, weight_decay=1e-2, mask=decay_weights)
loss = lambda p, x, y: optax.softmax_cross_entropy_with_integer_labels(logits(p, x), y).mean()


def load_data(seed=0):  # the book's split, stratified, normalised with training statistics
    x, y = load_digits(return_X_y=True)  # (1797, 64) grey levels, (1797,) digits 0-9
    x, x_test, y, y_test = train_test_split(x, y, test_size=0.25, stratify=y, random_state=seed)
    x, _, y, _ = train_test_split(x, y, test_size=270, stratify=y, random_state=seed)  # 15 %
    mean, std = x.mean(axis=0), np.where(x.std(axis=0) > 1e-6, x.std(axis=0), 1.0)
    return jnp.asarray((x - mean) / std), jnp.asarray(y), (x_test - mean) / std, y_test


def logits(params, x):  # (B, 64) -> (B, 10)
    for layer in params[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


@jax.jit
def step(state, batch):
    params, opt_state = state
    value, grads = jax.value_and_grad(loss)(params, *batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), value


@jax.jit
def epoch(state, key, x, y):  # one program: shuffle, then scan the step over every batch
    order = jax.random.permutation(key, len(y))[: len(y) // BATCH * BATCH]  # drops the rest
    batches = (x[order].reshape(-1, BATCH, x.shape[1]), y[order].reshape(-1, BATCH))
    return jax.lax.scan(step, state, batches)  # the new state, and the loss of every step


def main(epochs=30, seed=0):
    x, y, x_test, y_test = load_data()
    init_key, data_key = jax.random.split(jax.random.key(seed))
    keys = jax.random.split(init_key, len(WIDTHS) - 1)  # He initialisation, zero biases
    params = [{"w": jax.random.normal(k, (m, n)) * np.sqrt(2 / m), "b": jnp.zeros(n)}
              for k, m, n in zip(keys, WIDTHS[:-1], WIDTHS[1:])]  # fmt: skip
    state = (params, optimizer.init(params))
    for key in jax.random.split(data_key, epochs):
        state, losses = epoch(state, key, x, y)
    accuracy = float(np.mean(np.argmax(logits(state[0], x_test), axis=-1) == y_test))
    print(f"{epochs} epochs, test accuracy {accuracy:.2%}")
    return accuracy


if __name__ == "__main__":
    main()
