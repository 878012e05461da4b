"""Issue 24's content checks inside equinox and flax nnx modules (jnp / jax.nn / jax.lax in the
methods, nothing of spmdtyped in the model): the ring MoE combine of an expert-parallel layer
(tokens gathered over `ep`, routed by `axis_index` and argsort, `jax.lax.ragged_dot`,
scatter-added into a zero buffer, `psum_scatter` back) with the residual added before the
reduction (SPMD210) or the reduction replaced by a slice at this device's index (SPMD213), and
the dense combine of one expert per device (`x_all @ self.w[0]`: the gathered tokens times
this device's expert weight) with the residual added before the reduction, its weights behind
`jax.lax.optimization_barrier` as FSDP code puts them (SPMD210).

Each buggy method: `infer` reports the code at its `# BUG` line and `typed_shard_map` raises it
there. Each fixed method passes both and equals a single-device reference in values and in
the gradients of its parameters (`eqx.filter_grad` / `nnx.grad`, and `jax.grad`).
"""

from __future__ import annotations

import inspect
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st

MESH = jax.make_mesh((2, 4), ("dp", "ep"), axis_types=(AxisType.Auto,) * 2)
E, E_LOCAL, T_LOCAL, D, F = 8, 2, 2, 8, 16   # 8 experts, 2 per ep device, 2 tokens per device
TOKENS = P(("dp", "ep"))
PARAM_SPECS = {"router": P(), "w_up": P("ep"), "w_down": P("ep")}
RTOL = ATOL = 2e-5


def _params(experts: int = E) -> dict[str, jax.Array]:
    k = jax.random.split(jax.random.key(7), 4)
    return {"router": jax.random.normal(k[0], (D, experts)),
            "w_up": jax.random.normal(k[1], (experts, D, F)) / 3,
            "w_down": jax.random.normal(k[2], (experts, F, D)) / 4}


def _tokens() -> jax.Array:
    return jax.random.normal(jax.random.key(8), (8 * T_LOCAL, D))


# ------------------------------------------------------------------ equinox


class RingMoE(eqx.Module):
    """This device's experts on the tokens of its `ep` group (a ring combine)."""

    router: jax.Array
    w_up: jax.Array
    w_down: jax.Array

    def routed(self, x_all: jax.Array) -> jax.Array:
        probs = jax.nn.softmax(x_all @ self.router, axis=-1)
        expert = jnp.argmax(probs, axis=-1)
        gate = jnp.take_along_axis(probs, expert[:, None], axis=-1)
        local = expert - jax.lax.axis_index("ep") * E_LOCAL
        slot = jnp.where((local >= 0) & (local < E_LOCAL), local, E_LOCAL)
        order = jnp.argsort(slot)
        sizes = jnp.bincount(slot, length=E_LOCAL + 1)[:E_LOCAL].astype(jnp.int32)
        h = jax.nn.gelu(jax.lax.ragged_dot(x_all[order], self.w_up, sizes))
        rows = jax.lax.ragged_dot(h, self.w_down, sizes) * gate[order]
        return jnp.zeros_like(x_all).at[order].add(rows)

    def fixed(self, x: jax.Array) -> jax.Array:
        x_all = jax.lax.all_gather(x, "ep", axis=0, tiled=True)
        return jax.lax.psum_scatter(self.routed(x_all), "ep", scatter_dimension=0, tiled=True) + x

    def residual_first(self, x: jax.Array) -> jax.Array:
        x_all = jax.lax.all_gather(x, "ep", axis=0, tiled=True)
        out = self.routed(x_all) + x_all  # BUG SPMD210
        return jax.lax.psum_scatter(out, "ep", scatter_dimension=0, tiled=True)

    def sliced(self, x: jax.Array) -> jax.Array:
        x_all = jax.lax.all_gather(x, "ep", axis=0, tiled=True)
        start = jax.lax.axis_index("ep") * T_LOCAL
        mine = jax.lax.dynamic_slice_in_dim(self.routed(x_all), start, T_LOCAL, axis=0)  # BUG SPMD213
        return mine + x


def ring_reference(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    probs = jax.nn.softmax(x @ p["router"], axis=-1)
    expert = jnp.argmax(probs, axis=-1)
    gate = jnp.take_along_axis(probs, expert[:, None], axis=-1)
    h = jax.nn.gelu(jnp.einsum("td,tdf->tf", x, p["w_up"][expert]))
    return jnp.einsum("tf,tfd->td", h, p["w_down"][expert]) * gate + x


def eqx_ring(method: str) -> Any:
    def body(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        return getattr(RingMoE(**p), method)(x)
    return body


# ------------------------------------------------------------------ flax nnx


class DenseExperts(nnx.Module):
    """One expert per `ep` device, every token through each (a dense combine): the gathered
    tokens times this device's expert weight, behind an optimization barrier."""

    def __init__(self, p: dict[str, jax.Array]) -> None:
        self.router = nnx.Param(p["router"])
        self.w_up = nnx.Param(p["w_up"])
        self.w_down = nnx.Param(p["w_down"])

    def contributions(self, x_all: jax.Array) -> jax.Array:
        w_up, w_down = jax.lax.optimization_barrier((self.w_up[...], self.w_down[...]))
        gate = jax.nn.softmax(x_all @ self.router[...], axis=-1)
        mine = jnp.take(gate, jax.lax.axis_index("ep"), axis=1)[:, None]
        # this device's expert on every token, weighted by its gate: its share of the combine
        return jax.nn.gelu(x_all @ w_up[0]) @ w_down[0] * mine

    def fixed(self, x: jax.Array) -> jax.Array:
        x_all = jax.lax.all_gather(x, "ep", axis=0, tiled=True)
        y = self.contributions(x_all)
        return jax.lax.psum_scatter(y, "ep", scatter_dimension=0, tiled=True) + x

    def residual_first(self, x: jax.Array) -> jax.Array:
        x_all = jax.lax.all_gather(x, "ep", axis=0, tiled=True)
        y = x_all + self.contributions(x_all)  # BUG SPMD210
        return jax.lax.psum_scatter(y, "ep", scatter_dimension=0, tiled=True)


def dense_reference(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    gate = jax.nn.softmax(x @ p["router"], axis=-1)
    h = jax.nn.gelu(jnp.einsum("td,edf->etf", x, p["w_up"]))
    return jnp.einsum("te,etf,efd->td", gate, h, p["w_down"]) + x


def nnx_dense(method: str) -> Any:
    def body(p: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        return getattr(DenseExperts(p), method)(x)
    return body


# ------------------------------------------------------------------ the table

#: name -> (buggy body, fixed body, reference, number of experts)
CASES = {
    "eqx_ring_residual_first": (eqx_ring("residual_first"), eqx_ring("fixed"), ring_reference,
                                RingMoE.residual_first, E),
    "eqx_ring_sliced": (eqx_ring("sliced"), eqx_ring("fixed"), ring_reference, RingMoE.sliced, E),
    "nnx_dense_residual_first": (nnx_dense("residual_first"), nnx_dense("fixed"),
                                 dense_reference, DenseExperts.residual_first, 4),
}


def _bug_line(method: Any) -> tuple[str, int, str]:
    lines, start = inspect.getsourcelines(method)
    for i, text in enumerate(lines):
        if "# BUG " in text:
            return __file__, start + i, text.split("# BUG ")[1].split()[0]
    raise AssertionError(f"{method.__name__} has no # BUG line")


def _inputs(experts: int) -> tuple[dict[str, jax.Array], jax.Array]:
    put = lambda a, s: jax.device_put(a, NamedSharding(MESH, s))  # noqa: E731
    params = jax.tree.map(put, _params(experts), PARAM_SPECS)
    return params, put(_tokens(), TOKENS)


@pytest.mark.parametrize("name", list(CASES))
def test_infer_reports_the_bug_at_its_line(name: str) -> None:
    buggy, _fixed, _ref, method, experts = CASES[name]
    params, x = _inputs(experts)
    rep = st.adapters.infer(buggy, params, x, mesh=MESH, in_specs=(PARAM_SPECS, TOKENS),
                            out_specs=TOKENS)
    file, line, code = _bug_line(method)
    assert [(v.code, v.file, v.line) for v in rep.violations][:1] == [(code, file, line)], rep


@pytest.mark.parametrize("name", list(CASES))
def test_typed_shard_map_raises_the_bug_at_its_line(name: str) -> None:
    buggy, _fixed, _ref, method, experts = CASES[name]
    params, x = _inputs(experts)
    step = st.adapters.typed_shard_map(buggy, mesh=MESH, in_specs=(PARAM_SPECS, TOKENS),
                                       out_specs=TOKENS)
    file, line, code = _bug_line(method)
    with pytest.raises(st.SpmdTypeError) as got:
        jax.jit(step)(params, x)
    assert (got.value.code, got.value.file, got.value.line) == (code, file, line)


@pytest.mark.parametrize("name", list(CASES))
def test_the_buggy_program_is_silently_wrong_under_jax(name: str) -> None:
    buggy, _fixed, ref, _method, experts = CASES[name]
    params, x = _inputs(experts)
    got = jax.jit(jax.shard_map(buggy, mesh=MESH, in_specs=(PARAM_SPECS, TOKENS),
                                out_specs=TOKENS))(params, x)
    assert not np.allclose(np.asarray(got), np.asarray(ref(_params(experts), _tokens())),
                           rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("grad", ["library", "jax"])
@pytest.mark.parametrize("name", list(CASES))
def test_the_fixed_program_equals_one_device(name: str, grad: str) -> None:
    _buggy, fixed, ref, _method, experts = CASES[name]
    params, x = _inputs(experts)
    assert st.adapters.infer(fixed, params, x, mesh=MESH, in_specs=(PARAM_SPECS, TOKENS),
                             out_specs=TOKENS).ok
    step = st.adapters.typed_shard_map(fixed, mesh=MESH, in_specs=(PARAM_SPECS, TOKENS),
                                       out_specs=TOKENS)
    want = ref(_params(experts), _tokens())
    np.testing.assert_allclose(np.asarray(jax.jit(step)(params, x)), np.asarray(want),
                               rtol=RTOL, atol=ATOL)

    def loss(p: dict[str, jax.Array]) -> jax.Array:
        return jnp.sum(step(p, x) ** 2)

    with jax.set_mesh(MESH):
        if grad == "jax":
            got = jax.jit(jax.grad(loss))(params)
        elif name.startswith("eqx"):
            got = eqx.filter_jit(eqx.filter_grad(loss))(params)
        else:   # nnx.grad of a module holding the parameters as nnx Params
            def loss_of(m: _Holder) -> jax.Array:
                return loss(m.arrays())
            state = nnx.grad(loss_of)(_Holder(params))
            got = {k: state[k][...] for k in PARAM_SPECS}
    expect = jax.grad(lambda p: jnp.sum(ref(p, _tokens()) ** 2))(_params(experts))
    for k in expect:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(expect[k]), rtol=1e-4,
                                   atol=1e-4, err_msg=k)


class _Holder(nnx.Module):
    """The parameters as nnx Params, for `nnx.grad`."""

    def __init__(self, p: dict[str, jax.Array]) -> None:
        self.router = nnx.Param(p["router"])
        self.w_up = nnx.Param(p["w_up"])
        self.w_down = nnx.Param(p["w_down"])

    def arrays(self) -> dict[str, jax.Array]:
        return {"router": self.router[...], "w_up": self.w_up[...], "w_down": self.w_down[...]}
