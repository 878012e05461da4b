"""Training steps written for `check_vma=False`, as production code writes them (equinox and
optax, `eqx.filter_value_and_grad`, flax nnx with `nnx.value_and_grad`, `jax.value_and_grad`
of dict pytrees, `jax.tree.map`
lambdas, a Megatron-style tensor-parallel MLP, gradient accumulation in a `scan`), on a 3-axis
mesh: the gradients JAX's autodiff leaves unsummed or sums twice when the checks are off
(`_engine.unchecked`). Each mistake runs silently wrong in raw JAX (shown against one device);
`typed_shard_map(..., check_vma=False)`, `st.adapters.checking(step)` and
`infer(..., check_vma=False)` report it at its line; each fixed step trains equal to one
device and is reported by none.

- SPMD410: the gradient of parameters replicated over the data axes, never reduced over them
  (or over one of them only): the out_spec P() returns one device's gradient.
- SPMD411: a `jax.lax.psum` (the row-parallel all-reduce, a psum'd loss) inside the
  differentiated function: with the checks off its transpose is a psum of a cotangent equal
  on every device (jax#3970): the gradient upstream of it is n times too large.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _helpers import assert_trees_close, line_ending_with
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st

DATA = ("dp", "fsdp")
FACES = ["typed_shard_map", "checking", "infer"]
OPT = optax.adamw(1e-2)


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 2, 2), ("dp", "fsdp", "tp"))


def _line(marker: str) -> int:
    return line_ending_with(__file__, marker)


def _put(mesh, tree, specs):
    return jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), tree, specs,
                        is_leaf=lambda s: isinstance(s, P))


def _run(face, step, args, *, mesh, in_specs, out_specs):
    """`step` under `face`, with check_vma=False: its outputs, or the SpmdTypeError it raised
    (for `infer`: its report's first violation)."""
    if face == "infer":
        rep = st.adapters.infer(step, *args, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                check_vma=False)
        found = [v for v in rep.violations if v.code in ("SPMD410", "SPMD411", "SPMD412")]
        if found:
            raise found[0]
        return None
    smap = st.adapters.typed_shard_map if face == "typed_shard_map" else jax.shard_map
    program = jax.jit(smap(step, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                           check_vma=False))
    if face == "checking":
        program = st.adapters.checking(program)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", st.adapters.CheckVmaWarning)
        return program(*args)


def _raises(code, face, step, args, **specs):
    with pytest.raises(st.SpmdTypeError) as e:
        _run(face, step, args, **specs)
    assert e.value.code == code, str(e.value)
    return e.value


def _close(got, want, rtol=1e-5):
    assert_trees_close(got, want, rtol=rtol, atol=1e-6)


def _far(got, want):
    return any(not np.allclose(np.asarray(g), np.asarray(w), rtol=1e-3, atol=1e-6)
               for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True))


# ---------------------------------------------------------------- an equinox MLP with optax


class MLP(eqx.Module):
    layers: list

    def __init__(self, key):
        k = jax.random.split(key, 3)
        self.layers = [eqx.nn.Linear(8, 16, key=k[0]), eqx.nn.Linear(16, 16, key=k[1]),
                       eqx.nn.Linear(16, 4, key=k[2])]

    def __call__(self, x):
        for layer in self.layers[:-1]:
            x = jax.nn.gelu(jax.vmap(layer)(x))
        return jax.vmap(self.layers[-1])(x)


def loss_fn(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


MODEL = MLP(jax.random.key(0))
PARAMS, STATIC = eqx.partition(MODEL, eqx.is_array)


def _batch():
    k = jax.random.split(jax.random.key(1), 2)
    return jax.random.normal(k[0], (16, 8)), jax.random.normal(k[1], (16, 4))


def eqx_step(mistake=""):
    def step(params, opt_state, x, y):
        model = eqx.combine(params, STATIC)
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)  # eqx grads
        if mistake == "pmean_dp_only":
            grads = jax.lax.pmean(grads, "dp")
        elif mistake != "no_pmean":
            grads = jax.lax.pmean(grads, DATA)
        updates, opt_state = OPT.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, jax.lax.pmean(loss, DATA)
    return step


def _eqx_args(mesh):
    x, y = _batch()
    opt_state = OPT.init(PARAMS)
    return (_put(mesh, PARAMS, jax.tree.map(lambda _: P(), PARAMS)),
            _put(mesh, opt_state, jax.tree.map(lambda _: P(), opt_state)),
            jax.device_put(x, NamedSharding(mesh, P(DATA))),
            jax.device_put(y, NamedSharding(mesh, P(DATA))))


EQX_SPECS = dict(in_specs=(P(), P(), P(DATA), P(DATA)), out_specs=(P(), P(), P()))


def _eqx_reference():
    x, y = _batch()
    loss, grads = eqx.filter_value_and_grad(loss_fn)(MODEL, x, y)
    updates, opt_state = OPT.update(grads, OPT.init(PARAMS), PARAMS)
    return eqx.apply_updates(PARAMS, updates), opt_state, loss


@pytest.mark.parametrize("face", ["typed_shard_map", "checking", "jax"])
def test_equinox_step_with_its_gradients_reduced_trains_equal_to_one_device(face, mesh):
    _close(_run(face, eqx_step(), _eqx_args(mesh), mesh=mesh, **EQX_SPECS), _eqx_reference())
    assert _run("infer", eqx_step(), _eqx_args(mesh), mesh=mesh, **EQX_SPECS) is None


@pytest.mark.parametrize("mistake", ["no_pmean", "pmean_dp_only"])
def test_each_equinox_mistake_is_real(mistake, mesh):
    params, _, _ = _run("jax", eqx_step(mistake), _eqx_args(mesh), mesh=mesh, **EQX_SPECS)
    assert _far(params, _eqx_reference()[0])


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize(("mistake", "axes"), [("no_pmean", ("dp",)),
                                               ("pmean_dp_only", ("fsdp",))])
def test_equinox_gradient_never_reduced_is_spmd410_at_the_gradient(face, mistake, axes, mesh):
    e = _raises("SPMD410", face, eqx_step(mistake), _eqx_args(mesh), mesh=mesh, **EQX_SPECS)
    assert tuple(e.axes) == axes and (e.file, e.line) == (__file__, _line("# eqx grads"))
    assert "jax.lax.pmean(grads" in e.fix
    assert f"meets per-device data at {__file__}:" in str(e)   # the forward line, in loss_fn


def test_infer_lists_every_axis_left_unsummed(mesh):
    rep = st.adapters.infer(eqx_step("no_pmean"), *_eqx_args(mesh), mesh=mesh, check_vma=False,
                            **EQX_SPECS)
    assert {a for v in rep.violations if v.code == "SPMD410" for a in v.axes} == set(DATA)
    assert "tp" not in {a for v in rep.violations for a in v.axes}   # nothing varies over tp


# ------------------------------------------- a Megatron MLP in dicts, jax.value_and_grad, tp


TP_SPECS = {"w1": P(None, "tp"), "b1": P("tp"), "w2": P("tp", None), "b2": P()}


def _tp_params():
    k = jax.random.split(jax.random.key(2), 4)
    return {"w1": jax.random.normal(k[0], (8, 16)) / 3, "b1": jax.random.normal(k[1], (16,)),
            "w2": jax.random.normal(k[2], (16, 4)) / 4, "b2": jax.random.normal(k[3], (4,))}


@jax.custom_vjp
def all_reduce(y):
    """Megatron's reduce-from-tensor-parallel region: psum forward, identity backward."""
    return jax.lax.psum(y, "tp")


all_reduce.defvjp(lambda y: (all_reduce(y), None), lambda _, ct: (ct,))


def tp_step(mistake=""):
    reduce = (lambda y: jax.lax.psum(y, "tp")) if mistake == "psum" else all_reduce  # all-reduce

    def step(params, x, y):
        def loss(p):
            h = jax.nn.relu(x @ p["w1"] + p["b1"])
            return jnp.mean((reduce(h @ p["w2"]) + p["b2"] - y) ** 2)

        value, grads = jax.value_and_grad(loss)(params)  # tp grads
        if mistake == "forgot_bias":
            grads = {k: g if k == "b2" else jax.lax.pmean(g, DATA) for k, g in grads.items()}
        else:
            grads = jax.tree.map(lambda g: jax.lax.pmean(g, DATA), grads)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), jax.lax.pmean(value, DATA)
    return step


def _tp_args(mesh):
    x, y = _batch()
    return (_put(mesh, _tp_params(), TP_SPECS), jax.device_put(x, NamedSharding(mesh, P(DATA))),
            jax.device_put(y, NamedSharding(mesh, P(DATA))))


TP_IO = dict(in_specs=(TP_SPECS, P(DATA), P(DATA)), out_specs=(TP_SPECS, P()))


def _tp_reference():
    x, y = _batch()

    def loss(p):
        return jnp.mean((jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"] - y) ** 2)

    value, grads = jax.value_and_grad(loss)(_tp_params())
    return jax.tree.map(lambda p, g: p - 0.1 * g, _tp_params(), grads), value


@pytest.mark.parametrize("face", ["typed_shard_map", "checking", "jax"])
def test_megatron_mlp_with_an_identity_backward_all_reduce_trains_equal_to_one_device(face, mesh):
    _close(_run(face, tp_step(), _tp_args(mesh), mesh=mesh, **TP_IO), _tp_reference())


def test_psum_in_the_differentiated_loss_is_real_and_forgetting_the_bias_too(mesh):
    want, _ = _tp_reference()
    got, _ = _run("jax", tp_step("psum"), _tp_args(mesh), mesh=mesh, **TP_IO)
    np.testing.assert_allclose(np.asarray(got["w1"] - _tp_params()["w1"]),
                               np.asarray(2 * (want["w1"] - _tp_params()["w1"])), rtol=1e-4)
    np.testing.assert_allclose(np.asarray(got["b2"]), np.asarray(want["b2"]), rtol=1e-5)
    got, _ = _run("jax", tp_step("forgot_bias"), _tp_args(mesh), mesh=mesh, **TP_IO)
    assert _far(got["b2"], want["b2"])


@pytest.mark.parametrize("face", FACES)
def test_psum_differentiated_under_check_vma_false_is_spmd411_at_the_psum(face, mesh):
    e = _raises("SPMD411", face, tp_step("psum"), _tp_args(mesh), mesh=mesh, **TP_IO)
    assert tuple(e.axes) == ("tp",) and (e.file, e.line) == (__file__, _line("# all-reduce"))
    assert e.op == "jax.lax.psum" and "'tp''s size times too large" in e.headline
    assert "custom_vjp" in e.fix and f"the gradient taken at {__file__}:{_line('# tp grads')}" in str(e)


@pytest.mark.parametrize("face", FACES)
def test_a_bias_left_out_of_the_reduction_is_spmd410(face, mesh):
    e = _raises("SPMD410", face, tp_step("forgot_bias"), _tp_args(mesh), mesh=mesh, **TP_IO)
    assert (e.file, e.line) == (__file__, _line("# tp grads"))
    # the output leaf of b2: the dict's keys flatten sorted (b1, b2, w1, w2)
    assert "output leaf 1" in e.headline, e.headline


# --------------------------------------- jax#3970: a psum'd loss, and how its gradient is reduced


def _3970(reduce_grads):
    def step(w, x, y):
        def loss(w):
            return jax.lax.psum(jnp.sum((jnp.tanh(x @ w) - y) ** 2), DATA) / 16  # summed loss

        return reduce_grads(jax.grad(loss)(w))
    return step


def _3970_args(mesh):
    x, y = _batch()
    w = jax.random.normal(jax.random.key(3), (8, 4))
    return (jax.device_put(w, NamedSharding(mesh, P())),
            *(jax.device_put(a, NamedSharding(mesh, P(DATA))) for a in (x, y)))


IO_3970 = dict(in_specs=(P(), P(DATA), P(DATA)), out_specs=P())


def _3970_reference():
    x, y = _batch()
    w = jax.random.normal(jax.random.key(3), (8, 4))
    return jax.grad(lambda w: jnp.sum((jnp.tanh(x @ w) - y) ** 2) / 16)(w)


@pytest.mark.parametrize("face", ["typed_shard_map", "checking", "jax"])
def test_psum_loss_then_pmean_gradient_is_right_and_quiet(face, mesh):
    """The psum's transpose multiplies by n, the pmean divides by n: right (jax#3970's way
    out), and not reported."""
    step = _3970(lambda g: jax.lax.pmean(g, DATA))
    _close(_run(face, step, _3970_args(mesh), mesh=mesh, **IO_3970), _3970_reference())


@pytest.mark.parametrize("face", FACES)
def test_psum_loss_then_psum_gradient_is_spmd411(face, mesh):
    step = _3970(lambda g: jax.lax.psum(g, DATA))
    got = _run("jax", step, _3970_args(mesh), mesh=mesh, **IO_3970)
    _close(got, 4 * _3970_reference(), rtol=1e-4)                # n = 4 devices hold the data
    e = _raises("SPMD411", face, step, _3970_args(mesh), mesh=mesh, **IO_3970)
    assert e.line == _line("# summed loss") and set(e.axes) <= set(DATA)


def _3970_compensated(allowed: bool):
    """jax#3970 compensated by hand: the psum'd loss's gradient is n times too large, and the
    step divides it back (a pmean would do both); under `st.allow("SPMD411")` it is the
    author's decision, not a mistake."""
    def step(w, x, y):
        def loss(w):
            with st.allow("SPMD411") if allowed else contextlib.nullcontext():
                return jax.lax.psum(jnp.sum((jnp.tanh(x @ w) - y) ** 2), DATA) / 16  # allowed psum

        g = jax.grad(loss)(w)
        return jax.lax.psum(g, DATA) / jax.lax.psum(1, DATA)   # the transpose's n taken back
    return step


@pytest.mark.parametrize("face", FACES)
def test_a_psum_compensated_by_hand_is_spmd411_unless_allowed(face, mesh):
    """The step is right (raw JAX equals one device), so the walk's SPMD411 is refused only
    without the opt-out; inside `with st.allow("SPMD411"):` every face runs it quiet."""
    args = _3970_args(mesh)
    _close(_run("jax", _3970_compensated(True), args, mesh=mesh, **IO_3970), _3970_reference())
    e = _raises("SPMD411", face, _3970_compensated(False), args, mesh=mesh, **IO_3970)
    assert e.line == _line("# allowed psum") and "st.allow('SPMD411')" in str(e)
    got = _run(face, _3970_compensated(True), args, mesh=mesh, **IO_3970)
    if face != "infer":
        _close(got, _3970_reference())


def _ring_sum(g, axis, n):
    """An all-reduce written by hand: n - 1 ppermutes around a ring, each device adding what
    it receives (a bidirectional or chunked ring in production code)."""
    perm = [(i, (i + 1) % n) for i in range(n)]
    acc = cur = g
    for _ in range(n - 1):
        cur = jax.lax.ppermute(cur, axis, perm)
        acc = jax.tree.map(jnp.add, acc, cur)
    return acc


def _ring_step(allowed: bool):
    def step(w, x, y):
        with st.allow("SPMD410") if allowed else contextlib.nullcontext():
            g = jax.grad(lambda w: jnp.mean((jnp.tanh(x @ w) - y) ** 2))(w)  # ring gradient
        return _ring_sum(_ring_sum(g, "dp", 2), "fsdp", 2) / 4
    return step


@pytest.mark.parametrize("face", FACES)
def test_a_gradient_summed_by_a_ring_of_ppermutes_is_spmd410_unless_allowed(face, mesh):
    """The walk cannot tell a ring of ppermutes and adds from per-device values: the summed
    gradient is SPMD410 (a false error, the step is right against one device), and
    `with st.allow("SPMD410"):` around the line the error names lets every face run it."""
    x, y = _batch()
    w = jax.random.normal(jax.random.key(3), (8, 4))
    args = _3970_args(mesh)
    want = jax.grad(lambda w: jnp.mean((jnp.tanh(x @ w) - y) ** 2))(w)
    _close(_run("jax", _ring_step(False), args, mesh=mesh, **IO_3970), want)
    e = _raises("SPMD410", face, _ring_step(False), args, mesh=mesh, **IO_3970)
    assert e.line == _line("# ring gradient")
    got = _run(face, _ring_step(True), args, mesh=mesh, **IO_3970)
    if face != "infer":
        _close(got, want)


# ------------------------------------------------ gradient accumulation over microbatches


def accumulate(reduce: bool):
    def step(w, x, y):
        def micro(acc, xy):
            g = jax.grad(lambda w: jnp.mean((jnp.tanh(xy[0] @ w) - xy[1]) ** 2))(w)  # micro
            return acc + g / 2, None

        acc, _ = jax.lax.scan(micro, jnp.zeros_like(w), (x.reshape(2, -1, 8), y.reshape(2, -1, 4)))
        return jax.lax.pmean(acc, DATA) if reduce else acc
    return step


def test_accumulated_gradient_reduced_after_the_scan_is_right(mesh):
    x, y = _batch()
    w = jax.random.normal(jax.random.key(3), (8, 4))
    # each device's two microbatches are the halves of its rows, in order
    want = jax.grad(lambda w: jnp.mean((jnp.tanh(x @ w) - y) ** 2))(w)
    for face in ("typed_shard_map", "checking", "jax"):
        _close(_run(face, accumulate(True), _3970_args(mesh), mesh=mesh, **IO_3970), want)


@pytest.mark.parametrize("face", FACES)
def test_accumulated_gradient_never_reduced_is_spmd410_inside_the_scan(face, mesh):
    e = _raises("SPMD410", face, accumulate(False), _3970_args(mesh), mesh=mesh, **IO_3970)
    assert e.line == _line("# micro")


# ------------------------------------------------------------------- what stays quiet


def test_per_device_gradients_kept_on_purpose_are_quiet(mesh):
    """Returned under an out_spec that names the data axes: one gradient per device, stacked."""
    def step(w, x, y):
        return jax.grad(lambda w: jnp.mean((jnp.tanh(x @ w) - y) ** 2))(w)[None]

    got = _run("typed_shard_map", step, _3970_args(mesh), mesh=mesh,
               in_specs=(P(), P(DATA), P(DATA)), out_specs=P(DATA))
    assert got.shape == (4, 8, 4)


def test_gradient_taken_outside_the_shard_map_is_quiet_and_right(mesh):
    """`jax.grad` of a check_vma=False shard_map whose body psums over tp: JAX divides the
    replicated output's cotangent before the body's transpose, and the transposed body's
    equations are no gradient the body computed."""
    def forward(p, x, y):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        return jax.lax.pmean(jnp.mean((jax.lax.psum(h @ p["w2"], "tp") + p["b2"] - y) ** 2), DATA)

    smapped = jax.shard_map(forward, mesh=mesh, in_specs=TP_IO["in_specs"], out_specs=P(),
                            check_vma=False)
    grads = st.adapters.checking(jax.jit(jax.grad(smapped)))(*_tp_args(mesh))
    x, y = _batch()
    want = jax.grad(lambda p: jnp.mean((jax.nn.relu(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]
                                        - y) ** 2))(_tp_params())
    _close(grads, want, rtol=1e-4)


def test_a_step_with_checks_on_is_not_walked_as_unchecked(mesh):
    """The same equinox step with check_vma=True and no pmean: JAX sums the gradient in the
    backward pass (the sum of the devices' mean-loss gradients, which adamw's update does not
    tell from their mean), nothing to report: the walk of what runs unchecked reads only
    check_vma=False programs."""
    program = st.adapters.typed_shard_map(eqx_step("no_pmean"), mesh=mesh, **EQX_SPECS)
    params, _, loss = jax.jit(program)(*_eqx_args(mesh))
    want, _, want_loss = _eqx_reference()
    _close((params, loss), (want, want_loss), rtol=1e-4)


def test_the_decorator_form_is_checked(mesh):
    """`@functools.partial(jax.shard_map, ..., check_vma=False)` inside a jitted train step:
    `checking(train_step)` finds the staged program."""
    @functools.partial(jax.shard_map, mesh=mesh, check_vma=False, **EQX_SPECS)
    def inner(params, opt_state, x, y):
        return eqx_step("no_pmean")(params, opt_state, x, y)

    @jax.jit
    def train_step(params, opt_state, x, y):
        return inner(params, opt_state, x, y)

    with pytest.raises(st.SpmdTypeError) as e:
        st.adapters.checking(train_step)(*_eqx_args(mesh))
    assert e.value.code == "SPMD410" and e.value.line == _line("# eqx grads")


def test_an_output_that_still_varies_is_warned_by_checking(mesh):
    """The loss returned without its pmean under out_specs P(): JAX rejects it with the checks
    on; with them off it returns one device's. `checking(step)` has no checked trace to ask,
    so the walk of what runs says it (a warning: code written for check_vma=False may return
    one device's value on purpose), at the line that computed the loss."""
    def step(params, opt_state, x, y):
        model = eqx.combine(params, STATIC)
        loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
        grads = jax.lax.pmean(grads, DATA)
        updates, opt_state = OPT.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss * 1.0  # local loss

    program = st.adapters.checking(jax.jit(jax.shard_map(step, mesh=mesh, check_vma=False,
                                                         **EQX_SPECS)))
    with pytest.warns(st.adapters.CheckVmaWarning) as caught:
        _, _, loss = program(*_eqx_args(mesh))
    (w,) = [w.message for w in caught]
    assert (w.code, w.line) == ("SPMD401", _line("# local loss")), str(w)
    assert "differs between devices over 'dp', 'fsdp'" in str(w)
    assert abs(float(loss) - float(_eqx_reference()[2])) > 1e-4     # one device's loss
    right = st.adapters.checking(jax.jit(jax.shard_map(eqx_step(), mesh=mesh, check_vma=False,
                                                       **EQX_SPECS)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")                   # the right step warns nothing
        right(*_eqx_args(mesh))


def test_the_warning_on_a_shard_map_differentiated_from_outside_names_no_index(mesh):
    """`jax.value_and_grad` of a shard-mapped loss, jitted: the shard_map JAX stages is the
    forward of the gradient, its residuals among its outputs (the loss is its output 3 on jax
    0.10.2). The warning names the loss's line and says whose outputs they are, not JAX's
    index as if it were the user's."""
    def local_loss(w, x, y):
        return jnp.mean((jnp.tanh(x @ w) - y) ** 2)   # loss without its pmean

    loss = jax.shard_map(local_loss, mesh=mesh, in_specs=(P(), P(DATA), P(DATA)),
                         out_specs=P(), check_vma=False)
    program = st.adapters.checking(jax.jit(jax.value_and_grad(loss)))
    with pytest.warns(st.adapters.CheckVmaWarning) as caught:
        program(*_3970_args(mesh))
    (w,) = [w.message for w in caught]
    assert (w.code, w.line) == ("SPMD401", _line("# loss without its pmean")), str(w)
    assert "output leaf" not in str(w) and "as autodiff staged it" in str(w), str(w)


# ------------------------------------------------------- flax nnx, nnx.value_and_grad inside


class Net(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(8, 16, rngs=rngs)
        self.l2 = nnx.Linear(16, 4, rngs=rngs)

    def __call__(self, x):
        return self.l2(jax.nn.gelu(self.l1(x)))


NNX_GRAPHDEF, NNX_STATE = nnx.split(Net(nnx.Rngs(0)))


def nnx_loss(model, x, y):
    return jnp.mean((model(x) - y) ** 2)


def nnx_step(mistake=""):
    def step(state, x, y):
        model = nnx.merge(NNX_GRAPHDEF, state)
        value, grads = nnx.value_and_grad(nnx_loss)(model, x, y)  # nnx grads
        if mistake != "no_pmean":
            grads = jax.tree.map(lambda g: jax.lax.pmean(g, DATA), grads)
        return jax.tree.map(lambda p, g: p - 0.1 * g, state, grads), jax.lax.pmean(value, DATA)
    return step


def _nnx_args(mesh):
    x, y = _batch()
    return (_put(mesh, NNX_STATE, jax.tree.map(lambda _: P(), NNX_STATE)),
            *(jax.device_put(a, NamedSharding(mesh, P(DATA))) for a in (x, y)))


NNX_IO = dict(in_specs=(P(), P(DATA), P(DATA)), out_specs=(P(), P()))


def _nnx_reference():
    x, y = _batch()
    value, grads = nnx.value_and_grad(nnx_loss)(nnx.merge(NNX_GRAPHDEF, NNX_STATE), x, y)
    return jax.tree.map(lambda p, g: p - 0.1 * g, NNX_STATE, grads), value


@pytest.mark.parametrize("face", ["typed_shard_map", "checking", "jax"])
def test_nnx_step_with_its_gradients_reduced_trains_equal_to_one_device(face, mesh):
    _close(_run(face, nnx_step(), _nnx_args(mesh), mesh=mesh, **NNX_IO), _nnx_reference())


@pytest.mark.parametrize("face", FACES)
def test_nnx_gradient_never_reduced_is_spmd410_at_the_gradient(face, mesh):
    state, _ = _run("jax", nnx_step("no_pmean"), _nnx_args(mesh), mesh=mesh, **NNX_IO)
    assert _far(state, _nnx_reference()[0])
    e = _raises("SPMD410", face, nnx_step("no_pmean"), _nnx_args(mesh), mesh=mesh, **NNX_IO)
    assert (e.file, e.line) == (__file__, _line("# nnx grads")), str(e)


# ---------------------------------------------- layers stacked under lax.scan (and a cond)


@jax.custom_vjp
def copy_to_tp(h):
    """Megatron's copy-to-tensor-parallel region: identity forward, psum backward (the
    cotangent of an input replicated over tp that the column-parallel matmul leaves partial)."""
    return h


copy_to_tp.defvjp(lambda h: (h, None), lambda _, ct: (jax.lax.psum(ct, "tp"),))


def scan_step(reduce, branch=False, copy=None, remat=False):
    """Layers stacked under `lax.scan`; with Megatron's pair (`copy_to_tp` before the
    column-parallel matmul, `all_reduce` after the row-parallel one) when `reduce` is
    `all_reduce` (unless `copy` says otherwise): the stacked layers differentiate the carry,
    whose cotangent needs both."""
    if copy is None:
        copy = copy_to_tp if reduce is all_reduce else (lambda h: h)

    def step(w1, w2, x):
        def loss(w1, w2):
            def layer(h, w):
                y = reduce(jnp.tanh(copy(h) @ w[0]) @ w[1])  # column-parallel input
                if branch:   # a transposed cond inside the transposed scan
                    y = jax.lax.cond(h.sum() > 0, lambda y: y, lambda y: 0.5 * y, y)
                return h + y, None

            body = jax.checkpoint(layer) if remat else layer   # recomputed in the backward pass
            return jnp.mean(jax.lax.scan(body, x, (w1, w2))[0] ** 2)

        return jax.grad(loss, (0, 1))(w1, w2)
    return step


SCAN_IO = dict(in_specs=(P(None, None, "tp"), P(None, "tp", None), P()),
               out_specs=(P(None, None, "tp"), P(None, "tp", None)))


def _scan_args(mesh):
    k = jax.random.split(jax.random.key(4), 3)
    w1, w2 = jax.random.normal(k[0], (3, 8, 16)) / 3, jax.random.normal(k[1], (3, 16, 8)) / 4
    x = jax.random.normal(k[2], (4, 8))
    return tuple(jax.device_put(a, NamedSharding(mesh, s))
                 for a, s in zip((w1, w2, x), SCAN_IO["in_specs"], strict=True))


def _scan_reference(mesh, branch=False):
    w1, w2, x = (np.asarray(a) for a in _scan_args(mesh))

    def loss(w1, w2):
        def layer(h, w):
            y = jnp.tanh(h @ w[0]) @ w[1]
            if branch:
                y = jax.lax.cond(h.sum() > 0, lambda y: y, lambda y: 0.5 * y, y)
            return h + y, None

        return jnp.mean(jax.lax.scan(layer, x, (w1, w2))[0] ** 2)

    return jax.grad(loss, (0, 1))(w1, w2)


@pytest.mark.parametrize("branch", [False, True])
@pytest.mark.parametrize("face", FACES)
def test_psum_in_layers_under_scan_is_spmd411_at_the_psum(face, branch, mesh):
    """The transposed scan's body carries no `transpose` in its own name stack: the walk
    knows it is in the backward pass from the equation that holds it."""
    step = scan_step(lambda y: jax.lax.psum(y, "tp"), branch)  # the scanned psum
    e = _raises("SPMD411", face, step, _scan_args(mesh), mesh=mesh, **SCAN_IO)
    assert e.line == _line("# the scanned psum")


@pytest.mark.parametrize("branch", [False, True])
def test_identity_backward_all_reduce_under_scan_is_quiet_and_right(branch, mesh):
    want = _scan_reference(mesh, branch)
    for face in ("typed_shard_map", "checking", "jax"):
        got = _run(face, scan_step(all_reduce, branch), _scan_args(mesh), mesh=mesh, **SCAN_IO)
        _close(got, want, rtol=1e-4)
    raw = _run("jax", scan_step(lambda y: jax.lax.psum(y, "tp"), branch), _scan_args(mesh),
               mesh=mesh, **SCAN_IO)
    assert _far(raw, want)                                     # the mistake is real


# ------------------------------- Megatron's copy-to-tensor-parallel region forgotten (SPMD412)


@pytest.mark.parametrize("branch", [False, True])
@pytest.mark.parametrize("face", FACES)
def test_copy_to_tp_forgotten_under_scan_is_spmd412_at_the_column_parallel_input(face, branch,
                                                                                 mesh):
    """The all-reduce's identity backward in place, the copy region before the column-parallel
    matmul forgotten: the carry's cotangent stays a partial sum over tp on each device, and
    the gradients of the layers below are wrong (raw JAX against one device); reported at the
    matmul whose input needed the copy."""
    step = scan_step(all_reduce, branch, copy=lambda h: h)
    want = _scan_reference(mesh, branch)
    got = _run("jax", step, _scan_args(mesh), mesh=mesh, **SCAN_IO)
    assert _far(got, want)
    e = _raises("SPMD412", face, step, _scan_args(mesh), mesh=mesh, **SCAN_IO)
    assert e.line == _line("# column-parallel input") and e.axes == ("tp",), str(e)
    assert "copy-to-tensor-parallel" in str(e)


def megatron_stack(copy):
    """Two Megatron MLP layers in a dict pytree, unrolled, `jax.value_and_grad` and an
    optax-free SGD update in a `jax.tree.map` lambda; data over dp x fsdp."""
    def step(params, x, y):
        def loss(p):
            h = x
            for layer in p["layers"]:
                u = jax.nn.gelu(copy(h) @ layer["w1"])  # the stack's column-parallel input
                h = h + all_reduce(u @ layer["w2"])
            return jnp.mean((h - y) ** 2)

        value, grads = jax.value_and_grad(loss)(params)
        grads = jax.tree.map(lambda g: jax.lax.pmean(g, DATA), grads)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), jax.lax.pmean(value, DATA)
    return step


def _stack_params():
    k = jax.random.split(jax.random.key(7), 4)
    return {"layers": [{"w1": jax.random.normal(k[2 * i], (8, 16)) / 3,
                        "w2": jax.random.normal(k[2 * i + 1], (16, 8)) / 4} for i in range(2)]}


STACK_SPECS = {"layers": [{"w1": P(None, "tp"), "w2": P("tp", None)}] * 2}
STACK_IO = dict(in_specs=(STACK_SPECS, P(DATA), P(DATA)), out_specs=(STACK_SPECS, P()))


def _stack_batch():
    """The batch of the stacked tensor-parallel models (dict and equinox): x, y."""
    return jax.random.normal(jax.random.key(8), (16, 8)), jax.random.normal(jax.random.key(9), (16, 8))


def _stack_step_args(mesh, params, specs):
    """`(params, x, y)` placed on the mesh: params by `specs`, the batch over the data axes."""
    return (_put(mesh, params, specs),
            *(jax.device_put(a, NamedSharding(mesh, P(DATA))) for a in _stack_batch()))


def _stack_args(mesh):
    return _stack_step_args(mesh, _stack_params(), STACK_SPECS)


def _stack_reference():
    x, y = _stack_batch()

    def loss(p):
        h = x
        for layer in p["layers"]:
            h = h + jax.nn.gelu(h @ layer["w1"]) @ layer["w2"]
        return jnp.mean((h - y) ** 2)

    value, grads = jax.value_and_grad(loss)(_stack_params())
    return jax.tree.map(lambda p, g: p - 0.1 * g, _stack_params(), grads), value


@pytest.mark.parametrize("face", ["typed_shard_map", "checking", "jax"])
def test_megatron_stack_with_both_regions_trains_equal_to_one_device(face, mesh):
    _close(_run(face, megatron_stack(copy_to_tp), _stack_args(mesh), mesh=mesh, **STACK_IO),
           _stack_reference(), rtol=1e-4)


@pytest.mark.parametrize("face", FACES)
def test_megatron_stack_without_the_copy_region_is_spmd412(face, mesh):
    step = megatron_stack(lambda h: h)
    got, _ = _run("jax", step, _stack_args(mesh), mesh=mesh, **STACK_IO)
    assert _far(got, _stack_reference()[0])
    e = _raises("SPMD412", face, step, _stack_args(mesh), mesh=mesh, **STACK_IO)
    assert e.line == _line("# the stack's column-parallel input"), str(e)


def fsdp_step(params, x, y):
    """ZeRO-3 / FSDP under check_vma=False: each weight sharded over fsdp, gathered inside the
    loss (its transpose, a reduce-scatter over fsdp, sums the partial cotangent of the gathered
    weight), the gradients pmean'd over dp (and fsdp's mean: the reduce-scatter summed)."""
    def loss(p):
        w1 = jax.lax.all_gather(p["w1"], "fsdp", axis=0, tiled=True)
        w2 = jax.lax.all_gather(p["w2"], "fsdp", axis=0, tiled=True)
        return jnp.mean((jnp.tanh(x @ w1) @ w2 - y) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    grads = jax.tree.map(lambda g: jax.lax.pmean(g, "dp") / 2, grads)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), jax.lax.pmean(value, DATA)


FSDP_SPECS = {"w1": P("fsdp", None), "w2": P("fsdp", None)}
FSDP_IO = dict(in_specs=(FSDP_SPECS, P(DATA), P(DATA)), out_specs=(FSDP_SPECS, P()))


@pytest.mark.parametrize("face", ["typed_shard_map", "checking", "jax"])
def test_fsdp_gathered_weights_are_quiet_and_right(face, mesh):
    """The gathered weight is replicated over fsdp and meets data that differs over fsdp: its
    cotangent is partial there, and the all_gather's transpose (a psum_scatter) completes it:
    no SPMD412, the step equal to one device."""
    x, y = _batch()
    k = jax.random.split(jax.random.key(5), 2)
    params = {"w1": jax.random.normal(k[0], (8, 16)) / 3, "w2": jax.random.normal(k[1], (16, 4)) / 4}

    def loss(p):
        return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)

    value, grads = jax.value_and_grad(loss)(params)
    want = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value
    args = (_put(mesh, params, FSDP_SPECS),
            *(jax.device_put(a, NamedSharding(mesh, P(DATA))) for a in (x, y)))
    _close(_run(face, fsdp_step, args, mesh=mesh, **FSDP_IO), want, rtol=1e-4)
    assert not [v for v in st.adapters.infer(fsdp_step, *args, mesh=mesh, check_vma=False,
                                             **FSDP_IO).violations if v.code.startswith("SPMD41")]


class TPBlock(eqx.Module):
    """A tensor-parallel MLP block as equinox writes it: `eqx.nn.Linear` layers without bias,
    the column-parallel one's weight sharded over tp by its out features, the row-parallel
    one's by its in features; `copy` / `reduce` are Megatron's two regions."""
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.up = eqx.nn.Linear(8, 16, use_bias=False, key=k1)
        self.down = eqx.nn.Linear(16, 8, use_bias=False, key=k2)

    def __call__(self, h, copy, reduce, allowed=False):
        with st.allow("SPMD412") if allowed else contextlib.nullcontext():
            u = jax.nn.gelu(jax.vmap(self.up)(copy(h)))  # the equinox column-parallel input
        return h + reduce(jax.vmap(self.down)(u))


EQX_BLOCKS = [TPBlock(k) for k in jax.random.split(jax.random.key(11), 2)]
EQX_TP_SPECS = [TPBlock(jax.random.key(0))] * 2
EQX_TP_SPECS = jax.tree.map(lambda _: P(), EQX_TP_SPECS)
EQX_TP_SPECS = [eqx.tree_at(lambda b: (b.up.weight, b.down.weight), s, (P("tp", None), P(None, "tp")))
                for s in EQX_TP_SPECS]


def eqx_tp_step(copy, allowed=False):
    def step(blocks, x, y):
        def loss(blocks):
            h = x
            for block in blocks:
                h = block(h, copy, all_reduce, allowed)
            return jnp.mean((h - y) ** 2)

        value, grads = eqx.filter_value_and_grad(loss)(blocks)
        grads = jax.tree.map(lambda g: jax.lax.pmean(g, DATA), grads)
        return jax.tree.map(lambda p, g: p - 0.1 * g, blocks, grads), jax.lax.pmean(value, DATA)
    return step


EQX_TP_IO = dict(in_specs=(EQX_TP_SPECS, P(DATA), P(DATA)), out_specs=(EQX_TP_SPECS, P()))


def _eqx_tp_args(mesh):
    return _stack_step_args(mesh, EQX_BLOCKS, EQX_TP_SPECS)


def _eqx_tp_reference():
    x, y = _stack_batch()

    def loss(blocks):
        h = x
        for block in blocks:
            h = block(h, lambda h: h, lambda y: y)
        return jnp.mean((h - y) ** 2)

    value, grads = eqx.filter_value_and_grad(loss)(EQX_BLOCKS)
    return jax.tree.map(lambda p, g: p - 0.1 * g, EQX_BLOCKS, grads), value


@pytest.mark.parametrize("face", ["typed_shard_map", "checking", "jax"])
def test_equinox_tp_blocks_with_both_regions_train_equal_to_one_device(face, mesh):
    _close(_run(face, eqx_tp_step(copy_to_tp), _eqx_tp_args(mesh), mesh=mesh, **EQX_TP_IO),
           _eqx_tp_reference(), rtol=1e-4)


@pytest.mark.parametrize("face", FACES)
def test_equinox_tp_blocks_without_the_copy_region_are_spmd412(face, mesh):
    step = eqx_tp_step(lambda h: h)
    got, _ = _run("jax", step, _eqx_tp_args(mesh), mesh=mesh, **EQX_TP_IO)
    assert _far(got, _eqx_tp_reference()[0])
    e = _raises("SPMD412", face, step, _eqx_tp_args(mesh), mesh=mesh, **EQX_TP_IO)
    assert (e.file, e.line) == (__file__, _line("# the equinox column-parallel input")), str(e)


@pytest.mark.parametrize("face", ["typed_shard_map", "checking", "jax"])
def test_rematerialised_layers_with_both_regions_are_quiet_and_right(face, mesh):
    """`jax.checkpoint` around the scanned layer: its forward equations are recomputed in the
    backward pass (JAX's `rematted_computation` scope), primal values there, never partial
    cotangents (they were a false SPMD412 before the walk told them apart)."""
    got = _run(face, scan_step(all_reduce, remat=True), _scan_args(mesh), mesh=mesh, **SCAN_IO)
    _close(got, _scan_reference(mesh), rtol=1e-4)


@pytest.mark.parametrize("face", FACES)
def test_rematerialised_layers_without_the_copy_region_are_spmd412(face, mesh):
    step = scan_step(all_reduce, copy=lambda h: h, remat=True)
    assert _far(_run("jax", step, _scan_args(mesh), mesh=mesh, **SCAN_IO), _scan_reference(mesh))
    e = _raises("SPMD412", face, step, _scan_args(mesh), mesh=mesh, **SCAN_IO)
    assert e.line == _line("# column-parallel input"), str(e)


class BiasedTPBlock(eqx.Module):
    """`TPBlock` whose row-parallel `eqx.nn.Linear` keeps equinox's default bias: added inside
    equinox's `__call__`, to each device's partial sum, before the all-reduce."""
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.up = eqx.nn.Linear(8, 16, use_bias=False, key=k1)
        self.down = eqx.nn.Linear(16, 8, key=k2)

    def __call__(self, h):
        u = jax.nn.gelu(jax.vmap(self.up)(copy_to_tp(h)))
        return h + all_reduce(jax.vmap(self.down)(u))  # the equinox row-parallel layer


BIASED = [BiasedTPBlock(k) for k in jax.random.split(jax.random.key(12), 2)]
BIASED_SPECS = [eqx.tree_at(lambda b: (b.up.weight, b.down.weight), jax.tree.map(lambda _: P(), b),
                            (P("tp", None), P(None, "tp"))) for b in BIASED]


def _biased_step(blocks, x, y):
    def loss(blocks):
        h = x
        for block in blocks:
            h = block(h)
        return jnp.mean((h - y) ** 2)

    value, grads = eqx.filter_value_and_grad(loss)(blocks)
    grads = jax.tree.map(lambda g: jax.lax.pmean(g, DATA), grads)
    return jax.tree.map(lambda p, g: p - 0.1 * g, blocks, grads), jax.lax.pmean(value, DATA)


@pytest.mark.parametrize("face", ["typed_shard_map", "checking"])
def test_equinox_bias_before_the_all_reduce_is_warned_wrong_either_way(face, mesh):
    """The bias equinox's `Linear` adds to each device's partial sum under `check_vma=False`:
    raw JAX trains with it counted once per tp device (wrong against one device). JAX
    rejects this body with the checks on (the custom_vjp regions written for check_vma=False),
    so the drop-in's checked trace has nothing to say: the refinement walk of the program that
    runs (`refine_walk.check_unchecked`, the states read from what it computes) warns at the
    model's line that the program is wrong with the checks off too, on `typed_shard_map` and
    `checking()`, and the program computes what JAX computes; `infer` lists it."""
    io = dict(in_specs=(BIASED_SPECS, P(DATA), P(DATA)), out_specs=(BIASED_SPECS, P()))
    args = _stack_step_args(mesh, BIASED, BIASED_SPECS)
    x, y = _stack_batch()

    def one_device(blocks):
        h = x
        for block in blocks:
            u = jax.nn.gelu(jax.vmap(block.up)(h))
            h = h + jax.vmap(block.down)(u)
        return jnp.mean((h - y) ** 2)

    value, grads = eqx.filter_value_and_grad(one_device)(BIASED)
    want = jax.tree.map(lambda p, g: p - 0.1 * g, BIASED, grads), value
    raw = _run("jax", _biased_step, args, mesh=mesh, **io)
    assert _far(raw, want)
    smap = st.adapters.typed_shard_map if face == "typed_shard_map" else jax.shard_map
    program = jax.jit(smap(_biased_step, mesh=mesh, check_vma=False, **io))
    if face == "checking":
        program = st.adapters.checking(program)
    with pytest.warns(st.adapters.CheckVmaWarning) as rec:
        got = program(*args)
    _close(got, raw)
    found = [w.message for w in rec if isinstance(w.message, st.adapters.CheckVmaWarning)
             and w.message.code == "SPMD210"]
    assert len(found) == 1 and found[0].line == _line("# the equinox row-parallel layer"), \
        [str(w.message) for w in rec]
    assert "SPMD210: wrong with check_vma=False too (JAX computes the same numbers either " \
           "way)" in str(found[0]), str(found[0])
    rep = st.adapters.infer(_biased_step, *args, mesh=mesh, check_vma=False, **io)
    assert [(v.code, v.line) for v in rep.violations] == [("SPMD210", found[0].line)]
    assert str(found[0]).removeprefix("check_vma=False: ") in rep.check_vma_changes


class NnxTPBlock(nnx.Module):
    """The same tensor-parallel block in flax nnx: `nnx.Linear` without bias, the up
    projection's kernel sharded over tp by its out features, the down one's by its in
    features."""

    def __init__(self, rngs):
        self.up = nnx.Linear(8, 16, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(16, 8, use_bias=False, rngs=rngs)

    def __call__(self, h, copy, reduce, allowed=False):
        with st.allow("SPMD412") if allowed else contextlib.nullcontext():
            u = jax.nn.gelu(self.up(copy(h)))  # the nnx column-parallel input
        return h + reduce(self.down(u))


class NnxTPStack(nnx.Module):
    def __init__(self, rngs):
        self.blocks = nnx.List([NnxTPBlock(rngs) for _ in range(2)])

    def __call__(self, h, copy, reduce, allowed=False):
        for block in self.blocks:
            h = block(h, copy, reduce, allowed)
        return h


NNX_TP_GRAPHDEF, NNX_TP_STATE = nnx.split(NnxTPStack(nnx.Rngs(3)))
NNX_TP_SPECS = jax.tree.map(lambda _: P(), NNX_TP_STATE)
for _i in range(2):
    NNX_TP_SPECS["blocks"][_i]["up"]["kernel"].set_value(P(None, "tp"))
    NNX_TP_SPECS["blocks"][_i]["down"]["kernel"].set_value(P("tp", None))


def nnx_tp_step(copy, allowed=False):
    def step(state, x, y):
        def loss(model):
            return jnp.mean((model(x, copy, all_reduce, allowed) - y) ** 2)

        value, grads = nnx.value_and_grad(loss)(nnx.merge(NNX_TP_GRAPHDEF, state))
        grads = jax.tree.map(lambda g: jax.lax.pmean(g, DATA), grads)
        return jax.tree.map(lambda p, g: p - 0.1 * g, state, grads), jax.lax.pmean(value, DATA)
    return step


NNX_TP_IO = dict(in_specs=(NNX_TP_SPECS, P(DATA), P(DATA)), out_specs=(NNX_TP_SPECS, P()))


def _nnx_tp_reference():
    x, y = _stack_batch()
    model = nnx.merge(NNX_TP_GRAPHDEF, NNX_TP_STATE)
    value, grads = nnx.value_and_grad(
        lambda m: jnp.mean((m(x, lambda h: h, lambda y: y) - y) ** 2))(model)
    return jax.tree.map(lambda p, g: p - 0.1 * g, NNX_TP_STATE, grads), value


@pytest.mark.parametrize("face", ["typed_shard_map", "checking", "jax"])
def test_nnx_tp_blocks_with_both_regions_train_equal_to_one_device(face, mesh):
    args = _stack_step_args(mesh, NNX_TP_STATE, NNX_TP_SPECS)
    _close(_run(face, nnx_tp_step(copy_to_tp), args, mesh=mesh, **NNX_TP_IO),
           _nnx_tp_reference(), rtol=1e-4)


@pytest.mark.parametrize("face", FACES)
def test_nnx_tp_blocks_without_the_copy_region_are_spmd412(face, mesh):
    step, args = nnx_tp_step(lambda h: h), _stack_step_args(mesh, NNX_TP_STATE, NNX_TP_SPECS)
    got, _ = _run("jax", step, args, mesh=mesh, **NNX_TP_IO)
    assert _far(got, _nnx_tp_reference()[0])
    e = _raises("SPMD412", face, step, args, mesh=mesh, **NNX_TP_IO)
    assert (e.file, e.line) == (__file__, _line("# the nnx column-parallel input")), str(e)


# ------------------------------------------------ SPMD412's opt-out inside a model's module


@jax.custom_vjp
def ring_copy_to_tp(h):
    """Megatron's copy region whose backward all-reduce is a ring of ppermutes written by hand
    (`_ring_sum`): right, but a sum the walk cannot read."""
    return h


ring_copy_to_tp.defvjp(lambda h: (h, None), lambda _, ct: (_ring_sum(ct, "tp", 2),))


#: the equinox and the flax nnx tensor-parallel steps: (step factory, args, reference, specs,
#: the marker of the column-parallel line in the module)
TP_MODULES = {
    "equinox": (eqx_tp_step, _eqx_tp_args, _eqx_tp_reference, EQX_TP_IO,
                "# the equinox column-parallel input"),
    "nnx": (nnx_tp_step, lambda mesh: _stack_step_args(mesh, NNX_TP_STATE, NNX_TP_SPECS),
            _nnx_tp_reference, NNX_TP_IO, "# the nnx column-parallel input"),
}


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("library", sorted(TP_MODULES))
def test_ring_copy_region_is_spmd412_unless_allowed_in_the_module(library, face, mesh):
    """A copy region summed by a ring: SPMD412 at the module's column-parallel line (a false
    error: the step is right against one device); `with st.allow("SPMD412"):` around that
    line inside the module's `__call__` (an equinox module under `eqx.filter_value_and_grad`,
    a flax nnx one under `nnx.value_and_grad`) lets every face run it, equal to one device."""
    make_step, make_args, reference, io, marker = TP_MODULES[library]
    args, want = make_args(mesh), reference()
    _close(_run("jax", make_step(ring_copy_to_tp), args, mesh=mesh, **io), want, rtol=1e-4)
    e = _raises("SPMD412", face, make_step(ring_copy_to_tp), args, mesh=mesh, **io)
    assert (e.file, e.line) == (__file__, _line(marker)), str(e)
    got = _run(face, make_step(ring_copy_to_tp, allowed=True), args, mesh=mesh, **io)
    if face != "infer":
        _close(got, want, rtol=1e-4)


# ------------------------------------ ring attention under check_vma=False, gradient inside


SP = 4


@pytest.fixture(scope="module")
def sp_mesh():
    return jax.make_mesh((2, SP), ("dp", "sp"))


def ring_attention(q, k, v):
    """Attention over a sequence sharded over sp: the key / value blocks go around the ring
    (`ppermute` under `lax.scan`), with an online softmax; q, k, v: (batch, local seq, d)."""
    perm = [(i, (i + 1) % SP) for i in range(SP)]

    def visit(carry, _):
        m, denom, o, k, v = carry
        s = jnp.einsum("btd,bsd->bts", q, k) / np.sqrt(q.shape[-1])
        m_new = jnp.maximum(m, s.max(-1))
        p, corr = jnp.exp(s - m_new[..., None]), jnp.exp(m - m_new)
        o = o * corr[..., None] + jnp.einsum("bts,bsd->btd", p, v)
        k, v = jax.lax.ppermute(k, "sp", perm), jax.lax.ppermute(v, "sp", perm)
        return (m_new, denom * corr + p.sum(-1), o, k, v), None

    init = (jnp.full(q.shape[:2], -jnp.inf), jnp.zeros(q.shape[:2]), jnp.zeros_like(q), k, v)
    (_, denom, o, _, _), _ = jax.lax.scan(visit, init, None, length=SP)
    return o / denom[..., None]


def _attention_loss(w, x, y, attention):
    out = attention(x @ w["q"], x @ w["k"], x @ w["v"]) @ w["o"]
    return jnp.sum((out - y) ** 2)


def _one_device_attention(q, k, v):
    s = jnp.einsum("btd,bsd->bts", q, k) / np.sqrt(q.shape[-1])
    return jnp.einsum("bts,bsd->btd", jax.nn.softmax(s, axis=-1), v)


def ring_step(axes):
    def step(w, x, y):
        loss, g = jax.value_and_grad(_attention_loss)(w, x, y, ring_attention)  # the ring's gradient
        n = x.shape[0] * x.shape[1] * 8   # the tokens of the global batch
        return (jax.lax.psum(loss, ("dp", "sp")) / n,
                jax.tree.map(lambda g: jax.lax.psum(g, axes) / n, g))
    return step


RING_SPECS = {k: P() for k in "qkvo"}
RING_IO = dict(in_specs=(RING_SPECS, P("dp", "sp"), P("dp", "sp")), out_specs=(P(), RING_SPECS))


def _ring_args(sp_mesh):
    k = jax.random.split(jax.random.key(21), 6)
    w = {n: jax.random.normal(k[i], (8, 8)) / np.sqrt(8) for i, n in enumerate("qkvo")}
    x, y = jax.random.normal(k[4], (4, 16, 8)), jax.random.normal(k[5], (4, 16, 8))
    want = jax.value_and_grad(
        lambda w: _attention_loss(w, x, y, _one_device_attention) / (4 * 16))(w)
    return (_put(sp_mesh, w, RING_SPECS), *_put(sp_mesh, (x, y), (P("dp", "sp"),) * 2)), want


@pytest.mark.parametrize("face", [*FACES, "jax"])
def test_ring_attention_with_its_gradients_summed_is_quiet_and_equal_to_one_device(face,
                                                                                  sp_mesh):
    """Ring attention written for check_vma=False (`ppermute`s of the key / value blocks under
    `lax.scan`, the cotangents going back around the ring in the backward pass), `jax.grad`
    inside the body, the replicated projections' gradients psum'd over dp and sp: no SPMD410 /
    411 / 412 on the ring, and one device's loss and gradients."""
    args, want = _ring_args(sp_mesh)
    got = _run(face, ring_step(("dp", "sp")), args, mesh=sp_mesh, **RING_IO)
    if face != "infer":
        _close(got, want, rtol=1e-4)


@pytest.mark.parametrize("face", FACES)
def test_ring_attention_gradients_left_unsummed_over_sp_are_spmd410(face, sp_mesh):
    args, want = _ring_args(sp_mesh)
    assert _far(_run("jax", ring_step("dp"), args, mesh=sp_mesh, **RING_IO), want)
    e = _raises("SPMD410", face, ring_step("dp"), args, mesh=sp_mesh, **RING_IO)
    assert e.line == _line("# the ring's gradient") and "'sp'" in e.headline, str(e)
