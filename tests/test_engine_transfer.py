"""The engine's memos of whole equations (issue 27, item 6: its cost): the refinement walk
replays an equation it walked before with the same operands' facts (`_engine.transfer`), and
the state walk its collective and elementwise predictions (`walk.Walk`), both keyed on the
equation's static facts (`_engine.eqns.static_key`).

A memo is right only if it changes nothing but the time: on every program of the bug suite
(buggy and fixed) and of the porting suite (the correct programs and their buggy variants),
`infer` lists the same violations, at the same lines, with the memos as without them (no
static key: every equation walked). Raw JAX bodies of repeated layers whose equations are
equal but whose operands differ only in what the walk knows of them (a bias divided by the
axis size against the bias itself; a result computed from other inputs) are reported at the
layer that has the bug, under `typed_shard_map` and `infer`; the fixed program equals a
single-device reference in values and gradients. The Llama-style decoder in equinox
(tests/_llama.py: repeated blocks of jnp / jax.nn) and its raw step (`eqx.filter_value_and_grad`,
optax, a `jax.tree.map` lambda) give the same verdict with the memos and without them.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import _llama
import bugs
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_engine_llama_eqx as llama_eqx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from test_porting import BUGS as PORT_BUGS
from test_porting import PROGRAMS as PORT_PROGRAMS
from test_porting import load, program

import spmdtyped as st
from spmdtyped._engine import eqns, transfer
from spmdtyped._engine.check import shard_map_eqn
from spmdtyped._engine.refine_facts import Side
from spmdtyped._engine.refine_walk import check_program


def _violations(body: Any, args: Any, mesh: Any, in_specs: Any, out_specs: Any) -> list[Any]:
    rep = st.adapters.infer(body, *args, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    return [(v.code, v.line) for v in rep.violations]


def _both(body: Any, args: Any, mesh: Any, in_specs: Any, out_specs: Any,
          monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[Any]]:
    memo = _violations(body, args, mesh, in_specs, out_specs)
    with monkeypatch.context() as m:
        m.setattr(eqns, "static_key", lambda eqn: None)   # no memo keys: walk all
        walked = _violations(body, args, mesh, in_specs, out_specs)
    return memo, walked


@pytest.mark.parametrize("name,variant", [(n, v) for n in bugs.BUG_CLASSES
                                          for v in ("buggy_body", "fixed_body")])
def test_bug_suite_same_report_without_memos(name: str, variant: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    m = importlib.import_module(f"bugs.{name}")
    memo, walked = _both(getattr(m, variant), m.make_inputs(), m.mesh, m.IN_SPECS, m.OUT_SPECS,
                         monkeypatch)
    assert memo == walked
    assert bool(memo) == (variant == "buggy_body")


@pytest.mark.parametrize("name,bug", [(n, None) for n in PORT_PROGRAMS] + list(PORT_BUGS))
def test_porting_suite_same_report_without_memos(name: str, bug: str | None, mesh_dp_tp: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    mod = load(name)
    body, in_specs, out_specs = program(mod, bug)
    memo, walked = _both(body, mod.make_args(mesh_dp_tp), mesh_dp_tp, in_specs, out_specs,
                         monkeypatch)
    assert memo == walked
    assert bool(memo) == (bug is not None)


# ------------------------------------------------------------------ repeated layers

LAYERS = 4
D = 16


def _line(fn: Any, marker: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, text in enumerate(lines) if marker in text)


TP = 4


def layers_prescaled_bias(x: Any, ws: Any, b: Any) -> Any:
    """Tensor-parallel MLP layers that add the bias to the row-parallel output before its
    psum: divided by the axis size first (each device adds its share), except in the third
    layer (counted once per device: SPMD210)."""
    h = x
    for i, (w1, w2) in enumerate(ws):
        y = jnp.tanh(h @ w1) @ w2
        share = b / TP if i != 2 else b
        y = y + jax.lax.pcast(share, "tp", to="varying")   # BUG at layer 2 only
        h = jax.lax.psum(y, "tp") + h
    return h


def layers_fixed(x: Any, ws: Any, b: Any) -> Any:
    h = x
    for i, (w1, w2) in enumerate(ws):
        y = jax.lax.psum(jnp.tanh(h @ w1) @ w2, "tp")
        h = (y + b if i == 2 else y) + h
    return h


def layers_fixed_reference(x: Any, ws: Any, b: Any) -> Any:
    h = x
    for i, (w1, w2) in enumerate(ws):
        y = jnp.tanh(h @ w1) @ w2
        h = (y + b if i == 2 else y) + h
    return h


SPECS = (P(), [(P(None, "tp"), P("tp", None))] * LAYERS, P())


def _args(mesh: Any) -> tuple[Any, ...]:
    rng = np.random.default_rng(0)

    def put(a: Any, spec: Any) -> Any:
        return jax.device_put(jnp.asarray(a, jnp.float32), NamedSharding(mesh, spec))

    ws = [(put(rng.normal(size=(D, 2 * D)) / 4, P(None, "tp")),
           put(rng.normal(size=(2 * D, D)) / 4, P("tp", None))) for _ in range(LAYERS)]
    return put(rng.normal(size=(4, D)), P()), ws, put(rng.normal(size=(D,)), P())


@pytest.fixture(scope="module")
def mesh() -> Any:
    return jax.make_mesh((2, 4), ("dp", "tp"))


def test_a_layer_equal_but_for_its_bias_is_reported(mesh: Any) -> None:
    """The `add` of every layer is the same equation, and so is the cast before it; the share
    of the other layers and the bias of the third differ only in what the walk knows of them
    (divided by the axis size): the memo tells them apart."""
    args = _args(mesh)
    at = _line(layers_prescaled_bias, "# BUG")
    rep = st.adapters.infer(layers_prescaled_bias, *args, mesh=mesh, in_specs=SPECS,
                            out_specs=P())
    assert [(v.code, v.line) for v in rep.violations] == [("SPMD210", at)]
    step = st.adapters.typed_shard_map(layers_prescaled_bias, mesh=mesh, in_specs=SPECS,
                                       out_specs=P())
    with pytest.raises(st.SpmdTypeError) as ei:
        jax.jit(step).lower(*args)
    assert (ei.value.code, ei.value.line) == ("SPMD210", at)


def test_repeated_layers_are_replayed(mesh: Any) -> None:
    """The layers after the first are replayed, not walked: the memo holds one entry per
    distinct equation, fewer than the equations walked."""
    args = _args(mesh)
    closed = jax.make_jaxpr(jax.shard_map(layers_fixed, mesh=mesh, in_specs=SPECS,
                                          out_specs=P()))(*args)
    found: list[Any] = []
    walk = check_program(shard_map_eqn(closed), ("dp", "tp"), mesh,
                         lambda e, where, extra: found.append(e))
    assert found == []
    body = shard_map_eqn(closed).params["jaxpr"]
    assert 0 < len(walk.transfer) < len(body.eqns) * 2 // 3


def test_the_lineage_of_a_replayed_result_is_its_own(mesh: Any) -> None:
    """A replayed equation's result is computed from its own operands' inputs (the facts are
    replayed, the lineage is not): a psum of an in_spec Shard combined with the other
    sharded input at the output is SPMD108 in the layer that does it."""

    def step(p: Any, g: Any, q: Any) -> Any:
        gp = jax.lax.pmean(g * 2.0, "tp")
        gq = jax.lax.pmean(q * 2.0, "tp")   # the same equations as g's, on q's slices
        return p - 0.1 * gp, q - 0.1 * gq   # BUG: p's update takes the mean of g's slices

    specs = (P("tp"), P("tp"), P("tp"))
    rng = np.random.default_rng(1)
    args = tuple(jax.device_put(jnp.asarray(rng.normal(size=(8,)), jnp.float32),
                                NamedSharding(mesh, P("tp"))) for _ in range(3))
    got = _violations(step, args, mesh, specs, (P("tp"), P("tp")))
    assert [code for code, _line in got] == ["SPMD108"]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(transfer, "key", lambda *a, **k: None)
        assert _violations(step, args, mesh, specs, (P("tp"), P("tp"))) == got


def test_the_fixed_layers_equal_one_device(mesh: Any) -> None:
    args = _args(mesh)
    step = jax.jit(st.adapters.typed_shard_map(layers_fixed, mesh=mesh, in_specs=SPECS,
                                               out_specs=P()))
    host = jax.tree.map(lambda a: jnp.asarray(np.asarray(a)), args)
    np.testing.assert_allclose(np.asarray(step(*args)), np.asarray(layers_fixed_reference(*host)),
                               rtol=1e-5, atol=1e-5)

    def loss(*a: Any) -> Any:
        return jnp.sum(step(*a) ** 2)

    with jax.set_mesh(mesh):
        grads = jax.grad(loss, argnums=(0, 1, 2))(*args)
    want = jax.grad(lambda *a: jnp.sum(layers_fixed_reference(*a) ** 2),
                    argnums=(0, 1, 2))(*host)
    for g, w in zip(jax.tree.leaves(grads), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-4)



# ------------------------------------------------------------------ an equinox model

@pytest.mark.parametrize("mistake", ["correct", *sorted(llama_eqx.MISTAKES)])
def test_equinox_llama_same_verdict_without_memos(mistake: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The Llama-style decoder in equinox (jnp / jax.nn inside the modules, repeated blocks),
    its raw step (`eqx.filter_value_and_grad`, optax, a `jax.tree.map` lambda) under
    `typed_shard_map`: each mistake is the same error at the same line with the memos and
    without them, and the correct step's loss is the same number."""

    def verdict() -> Any:
        model, state, x, y = llama_eqx.inputs()
        step = llama_eqx.make_raw_step("typed_shard_map", None if mistake == "correct"
                                       else mistake, llama_eqx.state_specs(state))
        try:
            return float(step(model, state, x, y)[2])
        except st.SpmdTypeError as e:
            return e.code, e.line

    with _llama.tensor_parallel():
        _llama.CONFIG["MISTAKE"] = mistake if mistake in ("bias_before_psum", "no_psum") else None
        memo = verdict()
        with monkeypatch.context() as m:
            m.setattr(eqns, "static_key", lambda eqn: None)
            walked = verdict()
    assert memo == walked
    assert isinstance(memo, float) == (mistake == "correct")


def test_a_reduction_is_keyed_on_the_terms_of_its_sum(mesh: Any) -> None:
    """The residual check of a psum (SPMD210) reads the two terms of the add its operand is,
    not only the operand: two psums of equal adds whose results the walk knows alike get
    different memo keys when one add's term is replicated over the axis and the other's is
    not, and equal keys when their terms are alike (`refine_content.residual_terms`)."""

    def two(a: Any, t1: Any, t2: Any) -> Any:
        return jax.lax.psum(a + t1, "tp"), jax.lax.psum(a + t2, "tp")

    spec = P(None, "tp")
    args = [jax.device_put(jnp.ones((4, 8), jnp.float32), NamedSharding(mesh, spec))] * 3
    closed = jax.make_jaxpr(jax.shard_map(two, mesh=mesh, in_specs=(spec,) * 3,
                                          out_specs=(P(),) * 2))(*args)
    body = shard_map_eqn(closed).params["jaxpr"]
    views = eqns.Views().all(getattr(body, "jaxpr", body))
    adds = [v for v in views if v.name == "add"]
    psums = [v for v in views if v.name in ("psum", "psum_invariant")]
    assert len(adds) == len(psums) == 2

    def keys(side: Side) -> list[Any]:
        side.eqns = [v.eqn for v in views]
        known: dict[Any, int] = {}
        return [transfer.key(p, p.key, {}, side, {}, {}, known, quiet=False, batched=False)
                for p in psums]

    side = Side()
    side.same[adds[0].eqn.invars[1]] = frozenset({"tp"})   # t1 replicated over tp
    first, second = keys(side)
    assert first is not None and second is not None and first != second
    side = Side()
    for add in adds:
        side.same[add.eqn.invars[1]] = frozenset({"tp"})
    first, second = keys(side)
    assert first == second


@jax.jit
def _keep(y: Any, b: Any) -> Any:
    return y * 2.0 + jnp.zeros_like(b)   # a partial sum scaled: clean (a zero term)


@jax.jit
def _add(y: Any, b: Any) -> Any:
    return y * 2.0 + b   # a replicated bias added to a partial sum: SPMD210


def test_calls_with_equal_operands_are_told_apart_by_their_bodies(mesh: Any) -> None:
    """A call is replayed by the shape of its nested jaxpr (`eqns.Views.call_key`), not only
    its operands: two jitted helpers with the same signature and the same operands, the
    second adding a replicated bias to the partial sum, are told apart (the second reported
    inside its body), and a call of the clean helper again is replayed."""

    def step(x_sh: Any, w_row: Any, b: Any) -> Any:
        y, bias = x_sh @ w_row, jax.lax.pcast(b, "tp", to="varying")
        return jax.lax.psum(_keep(y, bias) + _keep(y, bias) + _add(y, bias), "tp")

    specs = (P(None, "tp"), P("tp", None), P())
    rng = np.random.default_rng(2)
    args = tuple(jax.device_put(jnp.asarray(rng.normal(size=s), jnp.float32),
                                NamedSharding(mesh, p))
                 for s, p in zip([(4, 16), (16, 8), (8,)], specs, strict=True))
    rep = st.adapters.infer(step, *args, mesh=mesh, in_specs=specs, out_specs=P())
    assert [(v.code, v.line) for v in rep.violations] == [("SPMD210", _line(_add, "SPMD210"))]
    closed = jax.make_jaxpr(jax.shard_map(lambda *a: jax.lax.psum(
        _keep(a[0] @ a[1], jax.lax.pcast(a[2], "tp", to="varying"))
        + _keep(a[0] @ a[1], jax.lax.pcast(a[2], "tp", to="varying")), "tp"),
        mesh=mesh, in_specs=specs, out_specs=P()))(*args)
    walk = check_program(shard_map_eqn(closed), ("dp", "tp"), mesh, lambda *a: None)
    assert len(walk.calls) == 1   # the second call of `_keep` replayed, not walked again

    # the accepted program lowers, runs and equals one device, its gradient too
    def clean(x_sh: Any, w_row: Any, b: Any) -> Any:
        y, bias = x_sh @ w_row, jax.lax.pcast(b, "tp", to="varying")
        return jax.lax.psum(_keep(y, bias) + _keep(y, bias), "tp")

    step = st.adapters.typed_shard_map(clean, mesh=mesh, in_specs=specs, out_specs=P())

    def loss(*a: Any) -> Any:
        return jnp.sum(jnp.tanh(step(*a)))

    def reference(x_sh: Any, w_row: Any, b: Any) -> Any:
        return jnp.sum(jnp.tanh(4.0 * (x_sh @ w_row)))

    host = [jnp.asarray(np.asarray(a)) for a in args]
    np.testing.assert_allclose(jax.jit(step)(*args), 4.0 * (host[0] @ host[1]), rtol=1e-5,
                               atol=1e-5)
    with jax.set_mesh(mesh):
        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*args)
    want = jax.grad(reference, argnums=(0, 1, 2))(*host)
    for g, w in zip(grads, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-4)
