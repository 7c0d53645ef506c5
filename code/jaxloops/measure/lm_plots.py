"""Chapter 11's figures: the training curves and one head's attention weights."""

import math

import numpy as np

from jaxloops.measure.render import subplots


def training_curves(
    train_loss, epochs, curves: dict, *, steps_per_epoch: int, vocab_size: int, title: str
):
    """Per-epoch training loss and the hook's probe losses against the train step, with
    ln V, the loss of a uniform guess."""
    fig, ax = subplots(figsize=(7, 3.5))
    ax.plot(
        np.arange(1, len(train_loss) + 1) * steps_per_epoch,
        train_loss,
        "o",
        color="C0",
        alpha=0.4,
        label="train steps (epoch mean, parameters moving)",
    )
    for i, (name, curve) in enumerate(curves.items()):
        ax.plot(
            np.asarray(epochs) * steps_per_epoch,
            curve,
            ".-",
            color=f"C{i + 1}",
            label=f"{name} (hook)",
        )
    ax.axhline(math.log(vocab_size), color="gray", linestyle="--", label="ln V (uniform guess)")
    ax.set(xlabel="train step", ylabel="cross-entropy (nats per character)", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def attention_weights(weights, text: str, title: str):
    """One head's (T, T) attention weights, its axes labelled with the prompt's characters."""
    labels = [repr(c)[1:-1] if c != " " else "␣" for c in text]
    fig, ax = subplots(figsize=(7, 6.5))
    image = ax.imshow(weights, cmap="viridis")
    ax.set_xticks(range(len(labels)), labels, fontsize=7, family="monospace")
    ax.set_yticks(range(len(labels)), labels, fontsize=7, family="monospace")
    ax.set(xlabel="key position s (attended to)", ylabel="query position t", title=title)
    fig.colorbar(image, ax=ax, shrink=0.8, label="weight")
    fig.tight_layout()
    return fig
