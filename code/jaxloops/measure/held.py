"""Bytes of placed arrays that one device holds, read from their shards (chapter 12)."""

import jax


def device_bytes(tree, device=None) -> int:
    """Bytes of `tree`'s leaves (placed `jax.Array`s) held by one device.

    Args:
      device: the device to count; default: the device holding the first leaf's first
        addressable shard.
    Raises:
      ValueError: if `tree` has no leaves, or `device` holds none of them.
    """
    leaves = jax.tree.leaves(tree)
    if not leaves:
        raise ValueError(f"no arrays to count in {tree!r}")
    device = leaves[0].addressable_shards[0].device if device is None else device
    held = [s.data.nbytes for a in leaves for s in a.addressable_shards if s.device == device]
    if not held:
        raise ValueError(f"device {device} holds no shard of these arrays")
    return sum(held)
