"""Chapter 5's page: the sentences its compiler section glues (book/05_train_step.md)."""

import re

from jaxloops.measure import compiled as compiled_ops

_COUNTS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}
_ARRAY = re.compile(r"\w+\[[\d,]*\]")  # "f32[256,256]", "s32[]": a shape without its layout


def precision_fields(jaxpr_text: str) -> list[str]:
    """The distinct `precision=` values of a printed jaxpr, e.g.
    ["(Precision.HIGHEST, Precision.HIGHEST)"]; [] where it prints none (JAX's default)."""
    return sorted(set(re.findall(r"precision=(\([^)]*\)|[^\s\]]+)", jaxpr_text)))


def precision_note(jaxpr_text: str, setting: str | None) -> str:
    """Where the `precision` field of a printed jaxpr's `dot_general` comes from, as one
    Markdown sentence: this run's `jax_default_matmul_precision` (`setting`; None for JAX's
    default).

    Raises ValueError where the printout and the setting disagree (a field with no setting,
    or a setting that printed no field): the sentence would be false."""
    fields = precision_fields(jaxpr_text)
    if fields and setting is None:
        raise ValueError(f"the jaxpr carries precision={fields} with no default precision set")
    if setting is not None and not fields:
        raise ValueError(f"default matmul precision {setting!r}, but the jaxpr carries none")
    if not fields:
        return (
            "Its `dot_general` carries no `precision` field: this run multiplies at JAX's "
            "default matmul precision, as a notebook of your own does."
        )
    shown = " and ".join(f"`precision={field}`" for field in fields)
    return (
        f"Its `dot_general` carries {shown} only because this run sets "
        f"`JAX_DEFAULT_MATMUL_PRECISION={setting}`; at JAX's default, as in a notebook of your "
        "own, the field is absent."
    )


def fusion_output(shape: str) -> str:
    """In words, the arrays a fusion writes, from its result's shape as `fusions_of` gives it:
    "one f32[256,256] array", "a tuple of three f32[1024,1024] arrays"."""
    arrays = _ARRAY.findall(shape)
    if not arrays:
        raise ValueError(f"no array shape in {shape!r}")
    if len(arrays) == 1:
        return f"one {arrays[0]} array"
    count = _COUNTS.get(len(arrays), str(len(arrays)))
    if len(set(arrays)) == 1:
        return f"a tuple of {count} {arrays[0]} arrays"
    return f"a tuple of {count} arrays ({', '.join(arrays)})"


def update_sentence(ops: str, shape: str) -> str:
    """What the fusion that applies Adam's update to a weight matrix does besides, as a plain
    clause (no Markdown: the chip's copy is shown as text): whether it computes the weights'
    gradient itself (a `convolution`, XLA:TPU's matrix product, among its operations `ops`)
    and what it writes (`shape`)."""
    written = fusion_output(shape)
    if "convolution" in [op.strip() for op in ops.split(",")]:
        return (
            "the weights' gradient, a matrix product (a convolution, XLA:TPU's name for one), "
            f"is computed inside this kernel, which writes {written}: the new weights and both "
            "moments. The gradient never goes to memory"
        )
    return (
        f"the weights' gradient comes from a matrix product run before it, and it writes {written}"
    )


_BOOKKEEPING = ("parameter", "constant", "get-tuple-element", "tuple", "bitcast")


def compiled_kernels(compiled) -> list[tuple[str, str, str]]:
    """(name, opcode, shape) of each kernel a compiled program (or its HLO text) runs: each
    fusion is one, and so is each instruction left outside one. An asynchronous copy (a
    TPU's) is a -start and a -done: counted once, as its -done."""
    return [
        (name, op, shape)
        for name, op, shape in compiled_ops.entry_instructions(compiled)
        if op not in _BOOKKEEPING and not op.endswith("-start")
    ]


def weight_update_fusion(compiled, weight_shape: tuple[int, ...]) -> tuple[list[dict], dict | None]:
    """The top-level fusions of a compiled train step (or its HLO text) that write a float32
    array of `weight_shape`, alone or in a tuple, and of them the one that applies Adam's
    update to the weights (it takes a square root), or None.

    Returns:
      (the fusions writing that shape, as `fusions_of` rows; the update's row or None).
    """
    if not weight_shape or any(d < 1 for d in weight_shape):
        raise ValueError(f"weight_shape {weight_shape} is not the shape of a weight matrix")
    wide = f"f32[{','.join(map(str, weight_shape))}]"
    fused = {name for name, op, _ in compiled_kernels(compiled) if op == "fusion"}
    writes = [
        row
        for row in compiled_ops.fusions_of(compiled)
        if row["fusion"] in fused and wide in _ARRAY.findall(row["shape"])
    ]
    update = next((row for row in writes if "sqrt" in row["ops"].split(", ")), None)
    return writes, update
