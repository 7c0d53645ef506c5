"""Chapter 5's glued sentences: where a jaxpr's precision field comes from, and what the
fusion that updates the weights writes."""

import jax
import jax.numpy as jnp
import optax
import pytest

import jaxloops
from jaxloops.data import Batch
from jaxloops.pages import ch05_train_step as page


def printed_product(precision=None) -> str:
    a, b = jnp.ones((3, 5)), jnp.ones((5, 7))
    with jax.default_matmul_precision(precision):  # None: JAX's default (tests set "highest")
        return str(jax.make_jaxpr(lambda a, b: a @ b)(a, b))


def test_the_precision_field_is_the_runs_setting_and_absent_at_the_default():
    highest = printed_product("highest")
    assert page.precision_fields(highest) == ["(Precision.HIGHEST, Precision.HIGHEST)"]
    assert page.precision_fields(printed_product()) == []
    note = page.precision_note(highest, "highest")
    assert "`precision=(Precision.HIGHEST, Precision.HIGHEST)`" in note
    assert "`JAX_DEFAULT_MATMUL_PRECISION=highest`" in note
    assert note.endswith("at JAX's default, as in a notebook of your own, the field is absent.")
    default = page.precision_note(printed_product(), None)
    assert default.startswith("Its `dot_general` carries no `precision` field:")
    assert default.count(".") == 1  # one sentence: the details are the page's dropdown
    # Known-wrong: a printout and a setting that disagree would make the sentence false.
    with pytest.raises(ValueError, match="no default precision set"):
        page.precision_note(highest, None)
    with pytest.raises(ValueError, match="'highest', but the jaxpr carries none"):
        page.precision_note(printed_product(), "highest")


def test_a_fusions_output_in_words():
    assert page.fusion_output("f32[256,256]") == "one f32[256,256] array"
    three = "(f32[1024,1024], f32[1024,1024], f32[1024,1024])"
    assert page.fusion_output(three) == "a tuple of three f32[1024,1024] arrays"
    assert page.fusion_output("(f32[3,5], s32[])") == "a tuple of two arrays (f32[3,5], s32[])"
    with pytest.raises(ValueError, match="no array shape in '\\(\\)'"):
        page.fusion_output("()")


def test_the_update_sentence_says_the_gradient_is_fused_only_where_a_product_is():
    three = "(f32[1024,1024], f32[1024,1024], f32[1024,1024])"
    fused = page.update_sentence("add, convolution, divide, multiply, sqrt", three)
    assert "computed inside this kernel, which writes a tuple of three" in fused
    apart = page.update_sentence("add, divide, multiply, sqrt, subtract", "f32[256,256]")
    assert apart.endswith("run before it, and it writes one f32[256,256] array")
    # Shown as plain text where the chip's record is read: no Markdown in it.
    assert "`" not in fused and "`" not in apart
    # A name that merely contains the word is not the operation.
    assert "run before it" in page.update_sentence("convolution-like, add", "f32[7,11]")


def compiled_step(optimizer):
    params = jaxloops.init_mlp(jax.random.key(0), (5, 11, 7, 3))
    step = jaxloops.make_train_step(jaxloops.mlp_loss, optimizer)
    batch = Batch(jnp.ones((13, 5)), jnp.zeros((13,), jnp.int32))
    return jax.jit(step).lower(params, optimizer.init(params), batch).compile()


def test_the_fusion_that_updates_the_widest_weights_takes_adams_square_root():
    compiled = compiled_step(jaxloops.make_optimizer(1e-3, 0.1))
    kernels = page.compiled_kernels(compiled)
    assert kernels and all(op not in ("parameter", "tuple") for _, op, _ in kernels)
    writes, update = page.weight_update_fusion(compiled, (11, 7))
    assert update in writes and "sqrt" in update["ops"].split(", ")
    assert "f32[11,7]" in update["shape"]
    # Known-wrong: a shape no fusion writes finds nothing; plain SGD writes the weights in a
    # fusion that takes no square root, so no Adam update is found.
    assert page.weight_update_fusion(compiled, (13, 17)) == ([], None)
    writes, update = page.weight_update_fusion(compiled_step(optax.sgd(0.1)), (11, 7))
    assert writes and update is None
    with pytest.raises(ValueError, match=r"weight_shape \(0, 3\) is not"):
        page.weight_update_fusion(compiled, (0, 3))
