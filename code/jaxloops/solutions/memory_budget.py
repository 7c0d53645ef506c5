"""Answers to chapter 14's exercises: the biggest batch, and the fewest micro-batches, that
fit a memory budget by the chapter's formula."""

from jaxloops.memory import activation_bytes, state_bytes
from jaxloops.transformer import TransformerConfig


def largest_batch(config: TransformerConfig, length: int, budget_bytes: int) -> int:
    """The largest B whose residuals (`activation_bytes`) and AdamW state fit the budget.

    The residuals are linear in B with no constant term, so B = (budget - state) // (bytes
    at B = 1).
    """
    state = sum(state_bytes(config).values())
    per_example = activation_bytes(config, 1, length)["total"]
    if budget_bytes < state + per_example:
        raise ValueError(
            f"a budget of {budget_bytes} bytes does not hold one example: the state alone is "
            f"{state} bytes and one example's residuals {per_example}"
        )
    return (budget_bytes - state) // per_example


def fewest_micro_batches(config: TransformerConfig, batch: int, length: int, budget_bytes: int):
    """The smallest M dividing B whose step (residuals of B / M examples, AdamW state and
    the float32 gradient sum the accumulation carries) fits the budget."""
    state = sum(state_bytes(config).values()) + state_bytes(config)["grads"]
    for M in range(1, batch + 1):
        if batch % M == 0 and state + activation_bytes(config, batch // M, length)["total"] <= (
            budget_bytes
        ):
            return M
    raise ValueError(
        f"a budget of {budget_bytes} bytes does not hold the step even at M = {batch} "
        f"(one example per micro-batch)"
    )
