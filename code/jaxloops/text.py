"""Character-level text that needs no download: the Python standard library's own source.

The selection is fixed by rule, not by copy: the public top-level modules (`*.py` not
starting with `_`) of the running interpreter's standard library, in sorted file-name order,
concatenated up to a byte budget. Every build on the same Python reads the same text.
Characters outside printable ASCII map to one fixed character, so the vocabulary V is fixed.
"""

import functools
import pathlib
import platform
import sysconfig
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxloops.data import Batch

# "\n" then the 95 printable ASCII characters from " " to "~": V = 96 on every machine.
ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))
VOCAB_SIZE = len(ALPHABET)
UNKNOWN = "?"  # what a tab, a non-ASCII letter or any other character becomes

# Token id of every ASCII code point; anything beyond ASCII is looked up as UNKNOWN.
_ASCII_TO_ID = np.full(128, ALPHABET.index(UNKNOWN), dtype=np.int32)
_ASCII_TO_ID[[ord(c) for c in ALPHABET]] = np.arange(VOCAB_SIZE, dtype=np.int32)


class Corpus(NamedTuple):
    """Token ids (int32) of the train and validation text, and where the text came from."""

    train: np.ndarray  # (n_train,)
    validation: np.ndarray  # (n_validation,)
    files: tuple[str, ...]  # file names read, in order (the last one possibly cut short)
    python_version: str  # whose standard library was read
    split_file: str  # the module in which validation begins: the cut is mid-module
    split_offset: int  # characters of `split_file` that went to training


def text_to_ids(text: str) -> np.ndarray:
    """Token ids (len(text),) int32; characters outside `ALPHABET` become `UNKNOWN`."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)  # one code point each
    codes = np.where(codes < 128, codes, ord(UNKNOWN))
    return _ASCII_TO_ID[codes]


def ids_to_text(ids) -> str:
    """The text of token ids, any shape flattened in order."""
    ids = np.asarray(ids).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= VOCAB_SIZE):
        raise ValueError(
            f"token ids span [{ids.min()}, {ids.max()}]; expected [0, {VOCAB_SIZE - 1}]"
        )
    return "".join(ALPHABET[i] for i in ids)


def stdlib_files() -> list[pathlib.Path]:
    """The public top-level modules of this interpreter's standard library, sorted by name."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        (p for p in root.glob("*.py") if not p.name.startswith("_")), key=lambda p: p.name
    )
    if not files:
        raise ValueError(f"no standard-library sources found under {root}")
    return files


def load_stdlib_corpus(num_bytes: int, validation_fraction: float = 0.1) -> Corpus:
    """Reads `num_bytes` of standard-library source and splits it, train first.

    The validation text is the last `validation_fraction` of the characters read: a
    contiguous tail, not windows interleaved with the training text. The cut falls where the
    fraction says, so usually inside a module (`split_file`): that module's head is trained
    on and its tail validated; every later module is validation only.
    """
    if num_bytes < 1 or not 0 < validation_fraction < 1:
        raise ValueError(
            f"need num_bytes >= 1 and 0 < validation_fraction < 1, "
            f"got {num_bytes}, {validation_fraction}"
        )
    chunks, names, total = [], [], 0
    for path in stdlib_files():
        if total >= num_bytes:
            break
        data = path.read_bytes()[: num_bytes - total]
        chunks.append(data)
        names.append(path.name)
        total += len(data)
    if total < num_bytes:
        raise ValueError(
            f"the standard library holds only {total} bytes of public modules; "
            f"asked for {num_bytes}"
        )
    # Bytes outside ASCII decode to U+FFFD (or a cut character's half does): both -> UNKNOWN.
    # Each module decoded on its own so that character offsets are known per module.
    texts = [chunk.decode("utf-8", errors="replace") for chunk in chunks]
    ids = text_to_ids("".join(texts))
    cut = int(len(ids) * (1 - validation_fraction))
    first_chars = np.cumsum([0] + [len(text) for text in texts])  # where each module starts
    module = int(np.searchsorted(first_chars, cut, side="right")) - 1
    return Corpus(
        ids[:cut],
        ids[cut:],
        tuple(names),
        platform.python_version(),
        names[module],
        int(cut - first_chars[module]),
    )


@functools.partial(jax.jit, static_argnames=("steps", "batch_size", "seq_len"))
def sample_windows(
    key: jax.Array, tokens: jax.Array, steps: int, batch_size: int, seq_len: int
) -> Batch:
    """Random windows of `tokens` for `steps` train steps, drawn on the device.

    Returns:
      A `Batch` stacked on a leading steps axis, as `make_epoch` wants:
      x (steps, B, T) tokens and y (steps, B, T) the token after each one.
    """
    if min(steps, batch_size, seq_len) < 1:  # an empty batch would train on nothing
        raise ValueError(
            f"steps, batch_size and seq_len must be >= 1, got {steps}, {batch_size}, {seq_len}"
        )
    if tokens.ndim != 1:  # (B, n) rows would be cut as if they were tokens
        raise ValueError(f"tokens must be one stream (n,), got shape {tokens.shape}")
    if tokens.shape[0] < seq_len + 1:
        raise ValueError(
            f"text of {tokens.shape[0]} tokens is too short for windows of "
            f"{seq_len} inputs plus one target"
        )
    last_start = tokens.shape[0] - seq_len - 1  # the target of the last input is the last token
    starts = jax.random.randint(key, (steps, batch_size), 0, last_start + 1)  # (steps, B)
    positions = starts[..., None] + jnp.arange(seq_len)[None, None]  # (steps, B, T)
    return Batch(x=tokens[positions], y=tokens[positions + 1])


def spaced_windows(tokens, seq_len: int, count: int) -> Batch:
    """`count` windows evenly spaced over the whole of `tokens`: a fixed evaluation set.

    Returns:
      A `Batch` with x (count, T) and y (count, T), the targets shifted by one.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:  # (B, n) rows would be cut as if they were tokens
        raise ValueError(f"tokens must be one stream (n,), got shape {tokens.shape}")
    if count < 1 or seq_len < 1 or tokens.shape[0] < seq_len + 1:
        raise ValueError(
            f"cannot cut {count} windows of {seq_len} + 1 tokens from {tokens.shape[0]} tokens"
        )
    starts = np.linspace(0, tokens.shape[0] - seq_len - 1, count).astype(np.int64)  # (count,)
    positions = starts[:, None] + np.arange(seq_len)  # (count, T)
    return Batch(x=jnp.asarray(tokens[positions]), y=jnp.asarray(tokens[positions + 1]))
