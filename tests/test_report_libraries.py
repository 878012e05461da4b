"""`st.report` on a training step of an equinox model and of a flax nnx model: the same 2-layer
MLP, tensor parallel over tp inside `jax.shard_map` (column-parallel w1, row-parallel w2 with
the user's `jax.lax.psum`), the batch over dp, `eqx.filter_value_and_grad` /
`nnx.value_and_grad`, optax.adam. The jaxpr's collectives equal the compiled program's; the
forward pass holds the user's psum over tp and loss pmean over dp, the backward pass the
gradient psums over dp that autodiff makes (the transposes of the parameters' implicit pvary);
one step equals a single-device step of the same model. Skipped without equinox / flax."""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax  # type: ignore[import-untyped]
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st

D, H, B = 16, 64, 32
SPECS = {"w1": P(None, "tp"), "b1": P("tp"), "w2": P("tp", None), "b2": P()}
OPT = optax.adam(1e-2)
HAS = {lib: importlib.util.find_spec(lib) is not None for lib in ("equinox", "flax")}


@functools.cache
def _mesh() -> Any:
    return jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)


def _init() -> dict[str, Any]:
    k = jax.random.split(jax.random.key(0), 4)
    return {"w1": jax.random.normal(k[0], (D, H)) / 4, "b1": jnp.zeros((H,)) + 0.1,
            "w2": jax.random.normal(k[1], (H, D)) / 8, "b2": jnp.zeros((D,)) - 0.1}


def _batch() -> tuple[Any, Any]:
    k = jax.random.split(jax.random.key(1), 2)
    return jax.random.normal(k[0], (B, D)), jax.random.normal(k[1], (B, D))


def _mlp(w1: Any, b1: Any, w2: Any, b2: Any, x: Any, tp: str | None) -> Any:
    h = jax.nn.relu(x @ w1 + b1)
    y = h @ w2
    return (jax.lax.psum(y, tp) if tp else y) + b2


def _mse(pred: Any, y: Any, dp: str | None) -> Any:
    loss = jnp.mean((pred - y) ** 2)
    return jax.lax.pmean(loss, dp) if dp else loss


def _put(tree: Any, specs: Any) -> Any:
    return jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(_mesh(), s)), tree, specs,
                        is_leaf=lambda s: isinstance(s, P))


def _state_specs(state: Any, specs: Any) -> Any:
    return optax.tree_map_params(OPT, lambda _p, s: s, state, specs,
                                 transform_non_params=lambda _: P(),
                                 is_leaf=lambda s: isinstance(s, P))


def _reference() -> tuple[dict[str, Any], float]:
    """One adam step of the same MLP on one device (no shard_map, no collectives)."""
    p, (x, y) = _init(), _batch()
    loss, g = jax.value_and_grad(lambda p: _mse(_mlp(**p, x=x, tp=None), y, None))(p)
    updates, _ = OPT.update(g, OPT.init(p), p)
    return optax.apply_updates(p, updates), float(loss)


# ------------------------------------------------------------- the two models


def _equinox() -> tuple[Any, tuple[Any, ...], Any]:
    import equinox as eqx

    class MLP(eqx.Module):
        w1: jax.Array
        b1: jax.Array
        w2: jax.Array
        b2: jax.Array

        def __call__(self, x: Any, tp: str | None = None) -> Any:
            return _mlp(self.w1, self.b1, self.w2, self.b2, x, tp)

    specs = MLP(**SPECS)  # type: ignore[arg-type]
    model = _put(MLP(**_init()), specs)
    opt_state = OPT.init(eqx.filter(model, eqx.is_array))
    sspecs = _state_specs(opt_state, specs)

    @jax.jit
    @functools.partial(jax.shard_map, mesh=_mesh(), in_specs=(specs, sspecs, P("dp"), P("dp")),
                       out_specs=(specs, sspecs, P()))
    def step(model: Any, opt_state: Any, x: Any, y: Any) -> Any:
        loss, grads = eqx.filter_value_and_grad(lambda m: _mse(m(x, "tp"), y, "dp"))(model)
        updates, opt_state = OPT.update(grads, opt_state, model)
        return eqx.apply_updates(model, updates), opt_state, loss

    x, y = _batch()
    args = (model, opt_state, _put(x, P("dp")), _put(y, P("dp")))
    return step, args, lambda m: {k: getattr(m, k) for k in SPECS}


def _nnx() -> tuple[Any, tuple[Any, ...], Any]:
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, p: dict[str, Any]) -> None:
            self.w1, self.b1 = nnx.Param(p["w1"]), nnx.Param(p["b1"])
            self.w2, self.b2 = nnx.Param(p["w2"]), nnx.Param(p["b2"])

        def __call__(self, x: Any, tp: str | None = None) -> Any:
            return _mlp(self.w1[...], self.b1[...], self.w2[...], self.b2[...], x, tp)

    graphdef, params = nnx.split(MLP(_init()), nnx.Param)
    specs = jax.tree_util.tree_map_with_path(lambda path, _: SPECS[str(path[0].key)], params)
    params = _put(params, specs)
    opt_state = OPT.init(params)
    sspecs = _state_specs(opt_state, specs)

    @jax.jit
    @functools.partial(jax.shard_map, mesh=_mesh(), in_specs=(specs, sspecs, P("dp"), P("dp")),
                       out_specs=(specs, sspecs, P()))
    def step(params: Any, opt_state: Any, x: Any, y: Any) -> Any:
        model = nnx.merge(graphdef, params)
        loss, grads = nnx.value_and_grad(lambda m: _mse(m(x, "tp"), y, "dp"))(model)
        updates, opt_state = OPT.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    x, y = _batch()
    args = (params, opt_state, _put(x, P("dp")), _put(y, P("dp")))
    return step, args, lambda p: {k: p[k][...] for k in SPECS}


MODELS = {"equinox": ("equinox", _equinox), "nnx": ("flax", _nnx)}


@functools.cache
def _made(name: str) -> tuple[Any, tuple[Any, ...], Any]:
    lib, make = MODELS[name]
    if not HAS[lib]:
        pytest.skip(f"{lib} is not installed")
    return make()


def _expected() -> dict[tuple[Any, ...], tuple[int, int]]:
    """By hand: forward, the row-parallel psum of the local batch's (B/dp, D) output over tp
    and the loss pmean over dp; backward, one psum over dp per parameter, at its tp shard."""
    shards = sum(int(np.prod(v.shape)) // (4 if SPECS[k] != P() else 1) * 4
                 for k, v in _init().items())
    return {("all-reduce", ("tp",), "forward"): (1, B // 2 * D * 4),
            ("all-reduce", ("dp",), "forward"): (1, 4),
            ("all-reduce", ("dp",), "backward"): (4, shards)}


@pytest.mark.parametrize("name", list(MODELS))
def test_model_step_report_traced_equals_compiled(name: str) -> None:
    step, args, _ = _made(name)
    rep = st.report(step, *args)
    assert rep.was_compiled
    assert rep.summary() == rep.summary("compiled")
    assert rep.removed == [] and rep.added() == []
    assert rep.summary(by_phase=True) == _expected()
    assert {(c.phase, c.origin) for c in rep.collectives} == {("forward", "user"),
                                                              ("backward", "autodiff")}
    assert all(c.where and c.where.startswith(f"{__file__}:") for c in rep.collectives), \
        [c.where for c in rep.collectives]
    psum_line = _mlp.__code__.co_firstlineno + 3
    assert [c.where for c in rep.collectives if c.axes == ("tp",)] == [f"{__file__}:{psum_line}"]
    assert rep.flags == []


@pytest.mark.parametrize("name", list(MODELS))
def test_model_step_equals_one_device(name: str) -> None:
    step, args, params_of = _made(name)
    new, _, loss = step(*args)
    want, want_loss = _reference()
    got = params_of(new)
    for k in SPECS:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(want[k]), rtol=1e-5,
                                   atol=1e-6)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
