"""Chapter 12b's numbers: the critical batch with the scaling book's W beside this book's."""

# The scaling book (Austin et al. 2025) takes, for one axis of a TPU v5p's torus, an ICI
# bandwidth of 1.8e11 bytes/s (its bidirectional figure for the axis); with the v5p's 4.59e14
# bf16 FLOP/s it derives a data-parallel critical batch of C / W = 2,550 per device.
SCALING_BOOK_V5P_AXIS_BYTES_PER_S = 1.8e11
SCALING_BOOK_V5P_FLOPS_PER_S = 4.59e14


def two_ws(flops_per_s: float, ring_bytes_per_s: float) -> dict[str, float]:
    """C / W for a TPU v5p with this book's W (one direction of one axis's ring) and with the
    scaling book's (both directions), and the ratio of the two Ws.

    Raises:
      ValueError: if a rate is not positive.
    """
    if flops_per_s <= 0 or ring_bytes_per_s <= 0:
        raise ValueError(f"need positive rates, got {flops_per_s} FLOP/s, {ring_bytes_per_s} B/s")
    return {
        "this book": flops_per_s / ring_bytes_per_s,
        "scaling book": SCALING_BOOK_V5P_FLOPS_PER_S / SCALING_BOOK_V5P_AXIS_BYTES_PER_S,
        "w_ratio": SCALING_BOOK_V5P_AXIS_BYTES_PER_S / ring_bytes_per_s,
    }
