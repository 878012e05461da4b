"""One engine (issue 27): raw spellings of forms the typed runtime knows by their `st.*` name,
read from the jaxpr the same way by `infer`, `typed_shard_map` and `checking()`; each right
form computes the single-device numbers, each wrong one is caught with its code.

- a row-parallel bias pre-divided by the axis size, written `b / jax.lax.axis_size("tp")` or
  `b * 0.25` (tp=4): this device's share, right; divided by another number: still SPMD210;
- `jnp.pad(u, mode="reflect")` of an Unreduced value (JAX drops the state on the `rev` inside
  jnp.pad and restores it on the result): linear, right; `jnp.flip(u)` alone returned as a
  replicated value: SPMD202;
- `x - lax.pmax(x, "tp")` of a sharded x: a reduction across the devices, not SPMD215;
- the strict rows JAX's own tests hit (docs/porting.md): each caught in a raw body, and
  accepted, with JAX's numbers, under one `with st.allow(code):`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import _compat

H = jax.random.normal(jax.random.key(300), (4, 16), dtype=jnp.float32)
W2 = jax.random.normal(jax.random.key(301), (16, 8), dtype=jnp.float32)
B = jax.random.normal(jax.random.key(302), (8,), dtype=jnp.float32)
ROW_IN = (P("dp", "tp"), P("tp", None), P())
ROW_OUT = P("dp", None)


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "tp"))


def _faces(body, mesh, in_specs, out_specs, *args):
    """(infer's first code or None, typed_shard_map's result or code, checking()'s)."""
    rep = st.adapters.infer(body, *args, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    got = [rep.violations[0].code if rep.violations else None]
    for face in ("typed_shard_map", "checking"):
        try:
            if face == "typed_shard_map":
                f = st.adapters.typed_shard_map(body, mesh=mesh, in_specs=in_specs,
                                                out_specs=out_specs)
                got.append(np.asarray(jax.jit(f)(*args)))
            else:
                f = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
                got.append(np.asarray(st.adapters.checking(jax.jit(f))(*args)))
        except st.SpmdTypeError as e:
            got.append(e.code)
    return got


def _placed(mesh, x, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))


ROW_FORMS = {
    "b / axis_size": (lambda h, w, b: lax.psum(h @ w + b / lax.axis_size("tp"), "tp"), None),
    "b * 0.25": (lambda h, w, b: lax.psum(h @ w + b * 0.25, "tp"), None),
    "0.25 * b": (lambda h, w, b: lax.psum(0.25 * b + h @ w, "tp"), None),
    "b / 2 (the dp size, not tp's)": (lambda h, w, b: lax.psum(h @ w + b / 2, "tp"), "SPMD210"),
    "b": (lambda h, w, b: lax.psum(h @ w + b, "tp"), "SPMD210"),
}


ZERO_FORMS = {
    "0.0 * b": (lambda h, w, b: lax.psum(h @ w * 2.0 + 0.0 * b, "tp"), None),
    "b * 0": (lambda h, w, b: lax.psum(h @ w * 2.0 + b * 0, "tp"), None),
    "-(0.0 * tanh(b))": (lambda h, w, b: lax.psum(h @ w * 2.0 - (-(0.0 * jnp.tanh(b))), "tp"),
                         None),
    "(0.0 * b) / 2": (lambda h, w, b: lax.psum(h @ w * 2.0 + (0.0 * b) / 2.0, "tp"), None),
    "(0.0 * b) * 3": (lambda h, w, b: lax.psum(h @ w * 2.0 + (0.0 * b) * 3.0, "tp"), None),
    "(0.0 * b).astype": (lambda h, w, b: lax.psum(h @ w * 2.0 + (0.0 * b).astype(jnp.float32),
                                                  "tp"), None),
    "0.5 * b (not zero)": (lambda h, w, b: lax.psum(h @ w * 2.0 + 0.5 * b, "tp"), "SPMD210"),
    "0.0 * b + 1 (not zero)": (lambda h, w, b: lax.psum(h @ w * 2.0 + (0.0 * b + 1.0), "tp"),
                               "SPMD210"),
}


@pytest.mark.parametrize("form", ZERO_FORMS)
def test_a_zero_term_added_before_the_reduction_is_not_a_replicated_term(mesh, form):
    """`0.0 * b` keeps `b` in the program and adds nothing (JAX's tests write it): summed over
    the devices it is zero, so it is no bias counted once per device (SPMD210); any other
    multiple of `b` still is. Its gradient with respect to the sharded weight equals one
    device's."""
    body, want = ZERO_FORMS[form]
    args = (_placed(mesh, H, P("dp", "tp")), _placed(mesh, W2, P("tp", None)), B)
    got = _faces(body, mesh, ROW_IN, ROW_OUT, *args)
    if want is not None:
        assert got == [want, want, want]
        return
    assert got[0] is None, got[0]
    for res in got[1:]:
        np.testing.assert_allclose(res, np.asarray(H @ W2 * 2.0), rtol=1e-5, atol=1e-5)
    f = st.adapters.typed_shard_map(body, mesh=mesh, in_specs=ROW_IN, out_specs=ROW_OUT)
    grad = jax.jit(jax.grad(lambda h, w, b: (f(h, w, b) ** 2).sum(), argnums=(1, 2)))(*args)
    ref = jax.grad(lambda h, w, b: ((h @ w * 2.0 + 0.0 * b) ** 2).sum(), argnums=(1, 2))(H, W2, B)
    for g, r in zip(grad, ref, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-4)


TYPED_ZERO_FORMS = {
    "0.0 * b": (lambda b: 0.0 * b, None),
    "-(0.0 * b)": (lambda b: -(0.0 * b), None),
    "(0.0 * b) / 2": (lambda b: (0.0 * b) / 2.0, None),
    "(0.0 * b) * 3": (lambda b: (0.0 * b) * 3.0, None),
    "(0.0 * b).astype": (lambda b: (0.0 * b).astype(jnp.float32), None),
    "st.numpy.negative(b * 0)": (lambda b: st.numpy.negative(b * 0), None),
    "1.0 * b (not zero)": (lambda b: 1.0 * b, "SPMD210"),
    "0.0 * b + 1 (not zero)": (lambda b: 0.0 * b + 1.0, "SPMD210"),
    "2.0 / (0.0 * b) (not zero)": (lambda b: 2.0 / (0.0 * b), "SPMD210"),
}


@pytest.mark.parametrize("form", TYPED_ZERO_FORMS)
def test_a_zero_term_in_the_typed_dialect(mesh, form):
    """The same in `st.*` code: a zero term (`Refinement.zero`: the ops of
    `_rules.refine.ZERO_FLOWS` keep it) is accepted with one device's numbers; a replicated
    one is SPMD210, raised by the typed value's check at the line, as the engine and the
    plugin say (`tests/typing/pass_refine.py`, `fail_refine.py`)."""
    from spmdtyped import Invariant, Varying

    term, want = TYPED_ZERO_FORMS[form]

    def f(h: Varying["dp", "tp"], w: Varying["tp"], b: Invariant) -> Varying["dp"]:
        return st.psum(h @ w * 2.0 + term(b), "tp")

    typed = jax.jit(st.shard_map(f, mesh=mesh, in_specs=ROW_IN, out_specs=ROW_OUT))
    args = (_placed(mesh, H, P("dp", "tp")), _placed(mesh, W2, P("tp", None)), B)
    raw = _faces(lambda h, w, b: lax.psum(h @ w * 2.0 + term(b), "tp"), mesh, ROW_IN, ROW_OUT,
                 *args)
    if want is not None:
        with pytest.raises(st.SpmdTypeError) as e:
            typed(*args)
        assert e.value.code == want
        assert raw == [want] * 3   # the engine on the raw spelling agrees
        return
    np.testing.assert_allclose(np.asarray(typed(*args)), np.asarray(H @ W2 * 2.0),
                               rtol=1e-5, atol=1e-5)
    assert raw[0] is None


@pytest.mark.parametrize("form", ROW_FORMS)
def test_row_parallel_bias_pre_divided_by_the_axis_size(mesh, form):
    body, want = ROW_FORMS[form]
    args = (_placed(mesh, H, P("dp", "tp")), _placed(mesh, W2, P("tp", None)), B)
    got = _faces(body, mesh, ROW_IN, ROW_OUT, *args)
    if want is None:
        assert got[0] is None, got[0]
        for res in got[1:]:
            np.testing.assert_allclose(res, np.asarray(H @ W2 + B), rtol=1e-5, atol=1e-5)
    else:
        assert got == [want, want, want]


def test_pad_reflect_of_an_unreduced_value_is_linear(mesh):
    x = jax.random.normal(jax.random.key(5), (4, 16), dtype=jnp.float32)

    def body(v):
        u = lax.pcast(v, "tp", to="unreduced")
        return lax.psum(jnp.pad(u, 1, mode="reflect"), "tp")

    got = _faces(body, mesh, P(None, "tp"), P(), _placed(mesh, x, P(None, "tp")))
    if _compat.FEATURES.no_rule_rejects:  # jax 0.12.1: rev has no Unreduced rule; translated
        assert got == ["SPMD202"] * 3
        return
    want = np.asarray(jnp.pad(x.reshape(4, 4, 4).sum(1), 1, mode="reflect"))
    assert got[0] is None
    for res in got[1:]:
        np.testing.assert_allclose(res, want, rtol=1e-5, atol=1e-5)


def test_flip_of_an_unreduced_value_alone_is_spmd202(mesh):
    x = jax.random.normal(jax.random.key(6), (4, 16), dtype=jnp.float32)

    def body(v):
        u = lax.pcast(v, "tp", to="unreduced")
        return jnp.flip(u, 0)     # JAX types it replicated: each device returns its partial

    got = _faces(body, mesh, P(None, "tp"), P(), _placed(mesh, x, P(None, "tp")))
    assert got == ["SPMD202"] * 3


def test_tile_of_an_unreduced_value(mesh):
    """`jnp.tile` of partial sums is linear: the psum of the tiles is the tile of the sum. jax
    0.12.1 types it (its new `tile` primitive) but fails to lower it, so there it is SPMD202
    at the line before JAX's crash; elsewhere it runs with the reference numbers."""
    x = jax.random.normal(jax.random.key(8), (4, 16), dtype=jnp.float32)

    def body(v):
        u = lax.pcast(v, "tp", to="unreduced")
        return lax.psum(jnp.tile(u, 2), "tp")  # the tile's line

    got = _faces(body, mesh, P(None, "tp"), P(), _placed(mesh, x, P(None, "tp")))
    if _compat.FEATURES.tile_unreduced_unlowerable:
        assert got == ["SPMD202"] * 3
        f = st.adapters.typed_shard_map(body, mesh=mesh, in_specs=P(None, "tp"), out_specs=P())
        with pytest.raises(st.SpmdTypeError) as e:
            f(_placed(mesh, x, P(None, "tp")))
        assert (e.value.file, e.value.line) == (__file__, _line_of("# the tile's line"))
        return
    want = np.tile(np.asarray(x).reshape(4, 4, 4).sum(1), 2)
    assert got[0] is None
    for res in got[1:]:
        np.testing.assert_allclose(res, want, rtol=1e-5, atol=1e-5)


def test_jax_nn_softmax_in_an_equinox_module_under_filter_value_and_grad(mesh):
    """The user's spelling of attention scores: `jax.nn.softmax(x @ self.wq, axis=-1)` inside an
    equinox module, differentiated with `eqx.filter_value_and_grad` in a `st.shard_map` step
    hinted at the step only. `x @ self.wq` is a typed value, and jax 0.12.1's custom JVP of
    softmax gets it with a typed tangent; the loss and gradients equal one device's."""
    import equinox as eqx

    from spmdtyped import Varying

    class Scores(eqx.Module):
        wq: jax.Array
        wo: jax.Array

        def __call__(self, x):
            return jax.nn.softmax(x @ self.wq, axis=-1) @ self.wo

    model = Scores(jax.random.normal(jax.random.key(320), (16, 8), dtype=jnp.float32) / 4,
                   jax.random.normal(jax.random.key(321), (8, 4), dtype=jnp.float32))
    specs = Scores(P(), P())
    xs = jax.random.normal(jax.random.key(322), (8, 16), dtype=jnp.float32)

    @jax.jit
    @st.shard_map(mesh=mesh, in_specs=(specs, P("dp")), out_specs=(P(), specs))
    def step(m: Scores, x: Varying["dp"]):
        return eqx.filter_value_and_grad(lambda m: lax.pmean(jnp.mean(m(x) ** 2), "dp"))(m)

    placed = jax.tree.map(lambda a, s: _placed(mesh, a, s), model, specs)
    loss, grads = step(placed, _placed(mesh, xs, P("dp")))
    ref_loss, ref_grads = eqx.filter_value_and_grad(lambda m: jnp.mean(m(xs) ** 2))(model)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)


def test_shift_by_a_reduction_across_the_devices_is_not_spmd215(mesh):
    x = jax.random.normal(jax.random.key(7), (8, 8), dtype=jnp.float32)

    def body(v):
        return v - lax.pmax(v, "tp")

    got = _faces(body, mesh, P("tp"), P("tp"), _placed(mesh, x, P("tp")))
    want = np.asarray(x - x.reshape(4, 2, 8).max(0)[None].repeat(4, 0).reshape(8, 8))
    assert got[0] is None
    for res in got[1:]:
        np.testing.assert_allclose(res, want, rtol=1e-6)


STRICT_ROWS = {
    # (body, in_specs, out_specs, global input shapes, the code), as JAX's own tests write them
    # (docs/porting.md, "JAX's own test suite")
    "psum of an Invariant value (SPMD103)":
        (lambda x: lax.psum(lax.psum(x, "tp"), "tp"), (P(None, "tp"),), P(), [(2, 8)], "SPMD103"),
    "a replicated array as long as a shard (SPMD215)":
        (lambda x, y: x * y, (P("tp"), P()), P("tp"), [(8,), (2,)], "SPMD215"),
    "exp of a local sum of a shard (SPMD211)":
        (lambda x: jnp.exp(x.sum()) + x, (P("tp"),), P("tp"), [(8,)], "SPMD211"),
}


@pytest.mark.parametrize("row", STRICT_ROWS)
def test_a_strict_row_is_accepted_with_one_allow_in_a_raw_body(mesh, row):
    body, in_specs, out_specs, shapes, code = STRICT_ROWS[row]
    args = [_placed(mesh, jnp.arange(float(np.prod(s))).reshape(s), spec)
            for s, spec in zip(shapes, in_specs, strict=True)]
    f = st.adapters.typed_shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    with pytest.raises(st.SpmdTypeError) as e:
        jax.jit(f).trace(*args)
    assert e.value.code == code

    def allowed(*a):
        with st.allow(code):
            return body(*a)

    g = st.adapters.typed_shard_map(allowed, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    want = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs))(*args)
    np.testing.assert_array_equal(np.asarray(jax.jit(g)(*args)), np.asarray(want))


EQX_TERMS = {
    "0.0 * b": (lambda b: 0.0 * b, None),
    "-(0.0 * b) / 2 (a zero kept by ZERO_FLOWS)": (lambda b: -(0.0 * b) / 2.0, None),
    "jnp.negative(b * 0).astype": (lambda b: jnp.negative(b * 0).astype(jnp.float32), None),
    "0.5 * b": (lambda b: 0.5 * b, "SPMD210"),
}


@pytest.mark.parametrize("form", EQX_TERMS)
def test_a_zero_term_in_an_equinox_module_under_filter_value_and_grad(mesh, form):
    """The user's spelling: an equinox row-parallel layer written with jnp inside
    (`jnp.tanh(x @ self.w1) @ self.w2 + 0.0 * self.b` before `jax.lax.psum`), differentiated
    with `eqx.filter_value_and_grad` in a `st.shard_map` step whose hints are on the step only.
    A zero term (also negated, divided, cast) runs and its loss and gradients equal one
    device's; `0.5 * self.b` is SPMD210 at the layer's line."""
    term, want = EQX_TERMS[form]
    import equinox as eqx

    from spmdtyped import Varying

    class RowParallel(eqx.Module):
        w1: jax.Array
        w2: jax.Array
        b: jax.Array

        def __call__(self, x, reduce=lambda v: lax.psum(v, "tp")):
            return reduce(jnp.tanh(x @ self.w1) @ self.w2 + term(self.b))  # the layer's line

    w1 = jax.random.normal(jax.random.key(310), (16, 32), dtype=jnp.float32) / 4
    model = RowParallel(w1, W2.repeat(2, axis=0) / 4, B)
    specs = RowParallel(P(None, "tp"), P("tp", None), P())
    xs = jax.random.normal(jax.random.key(311), (4, 16), dtype=jnp.float32)

    @jax.jit
    @st.shard_map(mesh=mesh, in_specs=(specs, P("dp")), out_specs=(P(), specs))
    def step(m: RowParallel, x: Varying["dp"]):
        loss, grads = eqx.filter_value_and_grad(
            lambda m: lax.pmean(jnp.mean(m(x) ** 2), "dp"))(m)
        return loss, grads

    placed = jax.tree.map(lambda a, s: _placed(mesh, a, s), model, specs)
    if want is not None:
        with pytest.raises(st.SpmdTypeError) as e:
            step(placed, _placed(mesh, xs, P("dp")))
        assert e.value.code == want
        assert (e.value.file, e.value.line) == (__file__, _line_of("# the layer's line"))
        return
    loss, grads = step(placed, _placed(mesh, xs, P("dp")))
    ref_loss, ref_grads = eqx.filter_value_and_grad(
        lambda m: jnp.mean(m(xs, reduce=lambda v: v) ** 2))(model)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-5)


def test_jax_nn_softmax_in_a_flax_nnx_module_under_nnx_value_and_grad(mesh):
    """The same attention scores as a flax nnx module (`nnx.Param`s read with `[...]`): the
    typed parameters and the typed input reach `jax.nn.softmax`'s custom JVP (on by default in
    jax 0.12.1) through `nnx.value_and_grad` in a `st.shard_map` step; the loss and gradients
    equal one device's."""
    from flax import nnx

    from spmdtyped import Invariant, Varying

    class Scores(nnx.Module):
        def __init__(self, wq, wo):
            self.wq, self.wo = nnx.Param(wq), nnx.Param(wo)

        def __call__(self, x):
            return jax.nn.softmax(x @ self.wq[...], axis=-1) @ self.wo[...]

    wq = jax.random.normal(jax.random.key(330), (16, 8), dtype=jnp.float32) / 4
    wo = jax.random.normal(jax.random.key(331), (8, 4), dtype=jnp.float32)
    xs = jax.random.normal(jax.random.key(332), (8, 16), dtype=jnp.float32)

    def loss_and_grads(wq, wo, x, mean):
        loss, grads = nnx.value_and_grad(lambda m: mean(jnp.mean(m(x) ** 2)))(Scores(wq, wo))
        return loss, (grads["wq"][...], grads["wo"][...])

    @jax.jit
    @st.shard_map(mesh=mesh, in_specs=(P(), P(), P("dp")), out_specs=(P(), (P(), P())))
    def step(wq: Invariant, wo: Invariant, x: Varying["dp"]):
        return loss_and_grads(wq, wo, x, lambda v: lax.pmean(v, "dp"))

    loss, grads = step(_placed(mesh, wq, P()), _placed(mesh, wo, P()), _placed(mesh, xs, P("dp")))
    ref_loss, ref_grads = loss_and_grads(wq, wo, xs, lambda v: v)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("start", [0, 0.0], ids=["int", "float"])
def test_tree_reduce_of_partial_sums_from_a_zero_start(mesh, start):
    """`jax.tree.reduce(operator.add, sums, initializer=0)` (optax's `tree_sum`, the global
    norm's sum of squares) over per-leaf sums of tp-sharded leaves, then a psum: the start is a
    zero term, not a replicated one. jax 0.12.1 casts the pvary'd integer 0 to float before the
    add (a zero cast is a zero); every face accepts it and gives one device's total."""
    import operator

    a = jax.random.normal(jax.random.key(340), (4, 16), dtype=jnp.float32)
    b = jax.random.normal(jax.random.key(341), (16, 8), dtype=jnp.float32)

    def body(a, b):
        sums = [jnp.sum(a * a), jnp.sum(b * b)]
        return lax.psum(jax.tree.reduce(operator.add, sums, initializer=start), "tp")

    got = _faces(body, mesh, (P(None, "tp"), P("tp", None)), P(),
                 _placed(mesh, a, P(None, "tp")), _placed(mesh, b, P("tp", None)))
    assert got[0] is None
    for res in got[1:]:
        np.testing.assert_allclose(res, float(jnp.sum(a * a) + jnp.sum(b * b)), rtol=1e-5)


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(n for n, text in enumerate(f, 1) if text.rstrip().endswith(marker))


@pytest.mark.parametrize("form", EQX_TERMS)
def test_a_zero_term_in_a_flax_nnx_module_under_nnx_value_and_grad(mesh, form):
    """The same layer as a flax nnx module (`nnx.Param`s read with `[...]`, jnp inside), built
    in the body and differentiated with `nnx.value_and_grad` in a `st.shard_map` step: a zero
    term runs with one device's loss and gradients; `0.5 * self.b` is SPMD210 at the layer's
    line."""
    from flax import nnx

    from spmdtyped import Varying

    term, want = EQX_TERMS[form]

    class RowParallel(nnx.Module):
        def __init__(self, w1, w2, b):
            self.w1, self.w2, self.b = nnx.Param(w1), nnx.Param(w2), nnx.Param(b)

        def __call__(self, x, reduce=lambda v: lax.psum(v, "tp")):
            h = jnp.tanh(x @ self.w1[...]) @ self.w2[...]
            return reduce(h + term(self.b[...]))  # the nnx layer's line

    w1 = jax.random.normal(jax.random.key(312), (16, 32), dtype=jnp.float32) / 4
    w2 = W2.repeat(2, axis=0) / 4
    xs = jax.random.normal(jax.random.key(313), (4, 16), dtype=jnp.float32)
    specs = (P(None, "tp"), P("tp", None), P(), P("dp"))

    def loss_and_grads(m, x, reduce, mean):
        loss, grads = nnx.value_and_grad(lambda m: mean(jnp.mean(m(x, reduce) ** 2)))(m)
        return loss, (grads["w1"][...], grads["w2"][...], grads["b"][...])

    @jax.jit
    @st.shard_map(mesh=mesh, in_specs=specs, out_specs=(P(), specs[:3]))
    def step(w1, w2, b, x: Varying["dp"]):
        return loss_and_grads(RowParallel(w1, w2, b), x, lambda v: lax.psum(v, "tp"),
                              lambda v: lax.pmean(v, "dp"))

    args = [_placed(mesh, a, s) for a, s in zip((w1, w2, B, xs), specs, strict=True)]
    if want is not None:
        with pytest.raises(st.SpmdTypeError) as e:
            step(*args)
        assert e.value.code == want
        assert (e.value.file, e.value.line) == (__file__, _line_of("# the nnx layer's line"))
        return
    loss, grads = step(*args)
    ref_loss, ref_grads = loss_and_grads(RowParallel(w1, w2, B), xs, lambda v: v, lambda v: v)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-5)


# ------------------------------------------ JAX's fills of a typed value keep its sharding

@pytest.mark.parametrize("form", ["relu", "zeros_like", "where"])
def test_jax_fill_of_a_typed_value_keeps_its_sharding_on_an_explicit_mesh(form):
    """On an Explicit mesh, a shard_map over tp only (dp explicit) under `jax.grad`:
    `jax.nn.relu` of a typed matmul (its jvp rule fills with `lax.full_like` of the typed
    tangent), `jnp.zeros_like` of a typed value, `jnp.where` against a fill. JAX reads a
    tracer's sharding from its abstract value; a typed value's was read as none, the fill took
    the default sharding and the select failed ("select cases must have the same
    shardings"). The gradient equals one device's."""
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    act = {"relu": jax.nn.relu,
           "zeros_like": lambda h: h + jnp.zeros_like(h),
           "where": lambda h: jnp.where(h > 0, h, jnp.full_like(h, 0.5))}[form]
    inner = st.shard_map(lambda w, x: act(x @ w), in_specs=(P(None, "tp"), P()),
                         out_specs=P(None, "tp"), axis_names={"tp"})
    w = jax.random.normal(jax.random.key(310), (8, 16))
    x = jax.random.normal(jax.random.key(311), (6, 8))
    loss = lambda f: lambda w, x: jnp.sum(f(w, x) ** 2)  # noqa: E731
    with jax.set_mesh(mesh):
        got = jax.jit(jax.grad(loss(inner)))(
            jax.device_put(w, NamedSharding(mesh, P(None, "tp"))),
            jax.device_put(x, NamedSharding(mesh, P("dp", None))))
    want = jax.grad(loss(lambda w, x: act(x @ w)))(w, x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
