"""Data on the device: digits, normalised with training statistics, in fixed-size batches."""

import functools
import hashlib
import importlib.metadata
import inspect
import math
import os
import pathlib
from typing import NamedTuple

import jax
import numpy as np

# scikit-learn's digits, the data of chapters 2-7 and 12-13: named here once.
NUM_FEATURES = 64  # F_in: an 8 x 8 image of grey levels, flattened
NUM_CLASSES = 10  # C: the digits 0-9


class Batch(NamedTuple):
    """Inputs and integer targets; a pytree, so it passes through jit and scan."""

    x: jax.Array  # (B, F_in) features, or (B, T) tokens
    y: jax.Array  # (B,) class labels, or (B, T) next tokens


class Split(NamedTuple):
    train: Batch
    test: Batch
    validation: Batch | None = None  # held out from the training examples, if asked for


def check_examples(x, y, num_features: int, num_classes: int) -> None:
    """Raises ValueError naming what is wrong with a feature matrix and its labels."""
    x, y = np.asarray(x), np.asarray(y)
    if x.ndim != 2 or x.shape[1] != num_features:
        raise ValueError(f"features have shape {x.shape}; expected (examples, {num_features})")
    if x.shape[0] == 0:
        raise ValueError(f"features have shape {x.shape}: the data set is empty (0 examples)")
    if y.shape != (x.shape[0],):
        raise ValueError(f"labels have shape {y.shape}; expected ({x.shape[0]},) to match features")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"features contain {int(np.sum(~np.isfinite(x)))} non-finite values")
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels have dtype {y.dtype}; expected an integer dtype")
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels span [{y.min()}, {y.max()}]; expected [0, {num_classes - 1}]")


def check_leading_axes(data) -> int:
    """The number of examples: the leading axis every leaf of `data` shares. A label array
    shorter than the features would otherwise be indexed out of bounds, which JAX clamps."""
    sizes = [leaf.shape[0] if leaf.ndim else None for leaf in jax.tree.leaves(data)]
    if None in sizes or len(set(sizes)) > 1:
        shapes = [tuple(leaf.shape) for leaf in jax.tree.leaves(data)]
        raise ValueError(f"every array needs the same leading (examples) axis, got {shapes}")
    return sizes[0]


def check_batch_size(batch_size: int, num_examples: int) -> None:
    if num_examples == 0:
        raise ValueError(f"the data set is empty (0 examples): no batch of {batch_size} fits")
    if not 0 < batch_size <= num_examples:
        raise ValueError(f"batch size {batch_size} must be in [1, {num_examples}] (the examples)")


# A folder where `load_digits_split` keeps each split it computes, when set: a process that
# needs a split another process made reads it (milliseconds) instead of importing
# scikit-learn (about 1 s of CPU). The test suite sets it for itself and the processes it
# starts (tests/conftest.py); unset, nothing is read or written.
DATA_CACHE = "JAXLOOPS_DATA_CACHE"


def kept_in_data_cache(make_split):
    """`make_split(*args)`, read from the folder `$JAXLOOPS_DATA_CACHE` names when it holds
    that split (one .npz per arguments, scikit-learn version and source of `make_split`),
    else made and kept there."""

    signature = inspect.signature(make_split)

    @functools.cache  # the same for every call: read once, and only where the cache is used
    def version_and_code():
        # The split changes with scikit-learn's version or the function's code: both name it.
        code = hashlib.sha256(inspect.getsource(make_split).encode()).hexdigest()[:12]
        return f"sklearn{importlib.metadata.version('scikit-learn')}-{code}"

    @functools.wraps(make_split)
    def cached(*args, **kwargs):
        folder = os.environ.get(DATA_CACHE)
        if not folder:
            return make_split(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        key = "-".join(map(str, bound.arguments.values()))
        path = pathlib.Path(folder) / f"{make_split.__name__}-{key}-{version_and_code()}.npz"
        if path.exists():
            with np.load(path) as arrays:
                held = lambda n: f"{n}_x" in arrays
                part = lambda n: Batch(arrays[f"{n}_x"], arrays[f"{n}_y"]) if held(n) else None
                return Split(*map(part, Split._fields))
        split = make_split(*args, **kwargs)
        arrays = {f"{name}_{axis}": getattr(batch, axis)
                  for name, batch in zip(Split._fields, split) if batch is not None
                  for axis in ("x", "y")}  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.stem}-{os.getpid()}.partial.npz")
        np.savez(partial, **arrays)
        os.replace(partial, path)  # whole or absent: another process may be reading it
        return split

    return cached


@kept_in_data_cache
def load_digits_split(
    seed: int, test_fraction: float = 0.25, validation_fraction: float = 0.0
) -> Split:
    """scikit-learn's 8x8 digits, a stratified split, normalised with train statistics only.

    Args:
      seed: fixes which examples land in the test and validation sets.
      test_fraction: share of each class held out for testing.
      validation_fraction: share of all examples held out of training for validation
        (model selection, early stopping), apart from the test set; 0 for none.
    Returns:
      A `Split` of NumPy arrays: x (examples, NUM_FEATURES) float32, y (examples,) int32.
    Raises:
      ValueError: a validation set that leaves too few training examples, or holds too
        few to contain every class.
    """
    # Imported here: scikit-learn takes ~1 s to import, which every page would pay otherwise.
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = digits.images.reshape(len(digits.images), -1).astype(np.float32)  # (n, 8, 8) -> (n, 64)
    y = digits.target.astype(np.int32)
    num_validation = validation_size(len(y), test_fraction, validation_fraction)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=test_fraction, stratify=y, random_state=seed
    )
    validation = None
    if num_validation:
        x_train, x_val, y_train, y_val = train_test_split(
            x_train, y_train, test_size=num_validation, stratify=y_train, random_state=seed
        )
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    # Some corner pixels are always 0 in the training set: dividing by their std of 0 would
    # give inf, so they are only centred.
    std = np.where(std > 1e-6, std, 1.0)
    normalise = lambda a: ((a - mean) / std).astype(np.float32)
    if num_validation:
        validation = Batch(normalise(x_val), y_val)
    return Split(Batch(normalise(x_train), y_train), Batch(normalise(x_test), y_test), validation)


def validation_size(examples: int, test_fraction: float, validation_fraction: float) -> int:
    """Examples held out for validation (the share of all, rounded up, as scikit-learn does).

    Raises:
      ValueError: a fraction outside [0, 1), fewer validation examples than classes, or
        fewer than one training example per class left over.
    """
    classes = 10
    if not (0 < test_fraction < 1) or not (0 <= validation_fraction < 1):
        raise ValueError(
            f"need test_fraction in (0, 1) and validation_fraction in [0, 1), "
            f"got {test_fraction}, {validation_fraction}"
        )
    num_test = math.ceil(test_fraction * examples)
    num_validation = math.ceil(validation_fraction * examples)
    left = examples - num_test - num_validation
    if num_validation and num_validation < classes:
        raise ValueError(
            f"validation_fraction {validation_fraction} holds out {num_validation} examples, "
            f"fewer than the {classes} classes"
        )
    if left < classes:
        raise ValueError(
            f"validation_fraction {validation_fraction} with test_fraction {test_fraction} "
            f"leaves {max(left, 0)} of {examples} examples for training; a stratified split "
            f"needs at least one per class ({classes})"
        )
    return num_validation


def to_device(
    batch: Batch, num_features: int = NUM_FEATURES, num_classes: int = NUM_CLASSES
) -> Batch:
    """Checks examples (by default, as the digits' 64 features and 10 classes), then copies
    them to the default device once; the loop uses only these.

    Raises:
      ValueError: wrong feature count, labels out of [0, C), non-finite features.
    """
    check_examples(batch.x, batch.y, num_features, num_classes)
    return jax.device_put(batch)


@functools.partial(jax.jit, static_argnames="batch_size")
def epoch_batches(key: jax.Array, data: Batch, batch_size: int) -> Batch:
    """A fresh permutation of `data`, cut into equal batches; the remainder is dropped.

    Every batch has the same shape, so a jitted step compiles once. Jitted, it runs on the
    device as one program with no host round trip.

    Returns:
      A `Batch` whose leaves have a leading steps axis: x (steps, B, ...), y (steps, B, ...).
    """
    num_examples = check_leading_axes(data)
    check_batch_size(batch_size, num_examples)
    steps = num_examples // batch_size
    order = jax.random.permutation(key, num_examples)[: steps * batch_size]
    return jax.tree.map(
        lambda a: a[order].reshape(steps, batch_size, *a.shape[1:]),  # (n, ...) -> (steps, B, ...)
        data,
    )


def ragged_batches(data: Batch, batch_size: int) -> list[Batch]:
    """Consecutive batches that keep the remainder: the last one is shorter (a new shape)."""
    check_batch_size(batch_size, check_leading_axes(data))
    starts = range(0, data.x.shape[0], batch_size)
    return [jax.tree.map(lambda a, i=i: a[i : i + batch_size], data) for i in starts]
