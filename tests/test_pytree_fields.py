"""Typed values in the fields of an `eqx.Module`, a registered dataclass or a NamedTuple are
checked against the fields' state hints where they enter `st.shard_map` (issue 14, item 3):
SPMD403, as for a top-level parameter, naming the class, the field and the parameter.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import put
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Invariant, Varying


class MLP(eqx.Module):
    w1: st.Shard["tp", -1]      # column-parallel
    w2: Varying["tp"]           # row-parallel
    b: Invariant                # replicated
    scale: jax.Array            # no state hint: not checked

    def __call__(self, x):
        return (st.psum(jnp.tanh(x @ self.w1) @ self.w2, "tp") + self.b) * self.scale


class Model(eqx.Module):
    mlp: MLP
    head: Invariant


class Pair(NamedTuple):
    w: Varying["tp"]
    b: Invariant


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
    w: st.Shard["tp", -1]
    b: Invariant


GOOD = MLP(P(None, "tp"), P("tp", None), P(), P())


def _mlp():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    return MLP(jax.random.normal(k1, (4, 8)), jax.random.normal(k2, (8, 4)),
               jax.random.normal(k3, (4,)), jnp.full((4,), 0.5))


def _x():
    return jax.random.normal(jax.random.key(1), (8, 4))


def _place(mesh, tree, specs):
    return jax.tree.map(lambda a, s: put(mesh, a, s), tree, specs)


def _call(mesh, specs, model=None):
    model = _mlp() if model is None else model

    @jax.jit
    @st.shard_map(mesh=mesh, in_specs=(specs, P("dp")), out_specs=P("dp"))
    def apply(model: MLP, x: Varying["dp"]) -> Varying["dp"]:
        return model(x)

    return apply(_place(mesh, model, specs), put(mesh, _x(), P("dp")))


def test_fields_that_fit_their_hints_run_and_match_the_reference(mesh_dp_tp):
    got = _call(mesh_dp_tp, GOOD)
    m, x = _mlp(), _x()
    ref = (jnp.tanh(x @ m.w1) @ m.w2 + m.b) * m.scale
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-6)


def test_a_replicated_field_given_a_sharded_spec_is_spmd403(mesh_dp_tp):
    """b: Invariant through P("tp"): each device would add a quarter of b, broadcast."""
    with pytest.raises(st.BoundaryError) as info:
        _call(mesh_dp_tp, MLP(P(None, "tp"), P("tp", None), P("tp"), P()))
    e = info.value
    assert e.code == "SPMD403" and e.axes == ("tp",)
    for fragment in ("field MLP.b of parameter 'model'", "(model.b)", "but its hint is Invariant",
                     "varying over 'tp'", "in_spec: P('tp',)", "annotate MLP.b"):
        assert fragment in str(e), (fragment, str(e))


def test_a_shard_field_sharded_on_another_dimension_is_spmd403(mesh_dp_tp):
    model = MLP(jnp.ones((8, 8)), jnp.ones((8, 4)), jnp.ones(4), jnp.ones(4))
    with pytest.raises(st.BoundaryError) as info:
        _call(mesh_dp_tp, MLP(P("tp", None), P("tp", None), P(), P()), model)
    assert info.value.code == "SPMD403"
    assert "field MLP.w1" in str(info.value) and "Shard['tp', -1]" in str(info.value)


def test_a_varying_field_given_a_replicated_spec_is_accepted(mesh_dp_tp):
    """Varying is covariant (an Invariant value fits Varying["tp"]), as for parameters."""
    model = MLP(jnp.ones((4, 8)), jnp.ones((8, 4)), jnp.ones(4), jnp.ones(4))

    @st.shard_map(mesh=mesh_dp_tp, in_specs=(MLP(P(None, "tp"), P(), P(), P()), P("dp")),
                  out_specs=P("dp"))
    def apply(model: MLP, x: Varying["dp"]) -> Varying["dp"]:
        return x @ model.w2[:4] + model.b   # w2 arrives Invariant: it fits Varying["tp"]

    apply(_place(mesh_dp_tp, model, MLP(P(None, "tp"), P(), P(), P())),
          put(mesh_dp_tp, _x(), P("dp")))


def test_nested_modules_name_the_inner_class_and_the_path(mesh_dp_tp):
    model = Model(_mlp(), jnp.ones(4))
    ok = Model(GOOD, P())

    def run(specs):
        @st.shard_map(mesh=mesh_dp_tp, in_specs=(specs, P("dp")), out_specs=P("dp"))
        def apply(model: Model, x: Varying["dp"]) -> Varying["dp"]:
            return model.mlp(x) + model.head

        return apply(_place(mesh_dp_tp, model, specs), put(mesh_dp_tp, _x(), P("dp")))

    run(ok)
    bad = Model(MLP(P(None, "tp"), P("tp", None), P(), P()), P("dp"))
    with pytest.raises(st.BoundaryError) as info:
        run(bad)
    assert "field Model.head of parameter 'model' (model.head)" in str(info.value)
    bad = Model(MLP(P(None, "tp"), P(), P("tp"), P()), P())
    with pytest.raises(st.BoundaryError) as info:
        run(bad)
    assert "field MLP.b of parameter 'model' (model.mlp.b)" in str(info.value)


def test_namedtuple_and_dataclass_fields(mesh_dp_tp):
    def run(cls, specs):
        value = cls(jnp.ones((4, 8)), jnp.ones(8))

        @st.shard_map(mesh=mesh_dp_tp, in_specs=(specs,), out_specs=P())
        def total(p) -> Invariant:
            return st.psum((p.w.sum(0) * 0 + p.w.sum(0)).sum(), "tp") + p.b.sum()

        return total(_place(mesh_dp_tp, value, specs))

    assert float(run(Pair, Pair(P(None, "tp"), P()))) == 32.0 + 8.0
    assert float(run(Params, Params(P(None, "tp"), P()))) == 32.0 + 8.0
    with pytest.raises(st.BoundaryError, match=r"field Pair\.b of parameter 'p'"):
        run(Pair, Pair(P(None, "tp"), P("tp")))
    with pytest.raises(st.BoundaryError, match=r"field Params\.w of parameter 'p'") as info:
        run(Params, Params(P(), P()))
    assert info.value.code == "SPMD403" and "Invariant" in str(info.value)


def test_a_module_in_a_tuple_of_parameters_is_checked(mesh_dp_tp):
    specs = (MLP(P(None, "tp"), P("tp", None), P("dp"), P()),)

    @st.shard_map(mesh=mesh_dp_tp, in_specs=(specs, P("dp")), out_specs=P("dp"))
    def apply(models, x: Varying["dp"]) -> Varying["dp"]:
        return models[0](x)

    with pytest.raises(st.BoundaryError) as info:
        apply(_place(mesh_dp_tp, (_mlp(),), specs), put(mesh_dp_tp, _x(), P("dp")))
    assert "field MLP.b of parameter 'models' (models[0].b)" in str(info.value)


# ----------------------------------------------------------------------------- specs from Shard hints


class Col(eqx.Module):
    w1: st.Shard["tp", -1]      # column-parallel: P(None, "tp")
    w2: st.Shard["tp", -2]      # row-parallel: P("tp", None)
    b: Invariant                # P()


def test_shard_field_hints_derive_the_specs(mesh_dp_tp):
    """No in_specs / out_specs: the module's spec tree comes from its Shard field hints."""
    @st.shard_map(mesh=mesh_dp_tp)
    def apply(m: Col, x: st.Float[Varying["dp"], "b/dp d"]) -> st.Shard["dp", 0]:
        return st.psum(jnp.tanh(x @ m.w1) @ m.w2, "tp") + m.b

    k1, k2 = jax.random.split(jax.random.key(3))
    m = Col(jax.random.normal(k1, (4, 8)), jax.random.normal(k2, (8, 4)), jnp.arange(4.0))
    specs = Col(P(None, "tp"), P("tp", None), P())
    got = apply(_place(mesh_dp_tp, m, specs), put(mesh_dp_tp, _x(), P("dp")))
    ref = jnp.tanh(_x() @ m.w1) @ m.w2 + m.b
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5, atol=1e-5)


def test_shard_hints_that_give_no_layout_are_spmd402(mesh_dp_tp):
    def right_counted(x: st.Float[Varying["dp"], "b/dp d"]) -> st.Shard["dp", -2]:
        return x

    def two_axes_one_dim(x: st.Typed[st.Shard["dp", 0], st.Shard["tp", 0]]) -> Invariant:
        return st.psum(x.sum(), ("dp", "tp"))

    x = put(mesh_dp_tp, _x(), P("dp"))
    with pytest.raises(st.BoundaryError, match="counts its dim from the right") as info:
        st.shard_map(right_counted, mesh=mesh_dp_tp)(x)
    assert info.value.code == "SPMD402"
    with pytest.raises(st.BoundaryError, match=r"shards dim 0 over \['dp', 'tp'\]"):
        st.shard_map(two_axes_one_dim, mesh=mesh_dp_tp)(x)


# ------------------------------------------------- the program mypy checks (tests/typing)


def _typing_program(name: str):
    """`tests/typing/<name>.py` imported as a module (the files mypy with the plugin checks)."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent / "typing" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_typing_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module      # the dataclass of the file resolves its own module
    spec.loader.exec_module(module)
    return module


def test_the_pytree_program_mypy_accepts_equals_the_reference(mesh_dp_tp):
    """tests/typing/pass_pytrees.py's equinox MLP (state-hinted fields, built from global arrays
    and as its own spec tree with no `type: ignore`): `jax.value_and_grad` of the module and the
    update by `jax.tree.map` over the gradients, under `st.shard_map` on dp x tp, equal a
    single-device run (loss, gradients, updated parameters)."""
    prog = _typing_program("pass_pytrees")
    model, specs, *_ = prog.build(jax.random.key(5))
    model = eqx.tree_at(lambda m: m.b, model, jnp.linspace(-1.0, 1.0, 4))
    x = jax.random.normal(jax.random.key(6), (8, 4))

    @jax.jit
    @st.shard_map(mesh=mesh_dp_tp, in_specs=(specs, P("dp")), out_specs=(specs, specs, P()))
    def run(m, xs):
        loss, grads = prog.step_jax(m, xs)
        return prog.step(m, xs), grads, loss

    new, grads, loss = run(_place(mesh_dp_tp, model, specs), put(mesh_dp_tp, x, P("dp")))

    def ref_loss(m):
        return jnp.mean((jnp.tanh(x @ m.w1) @ m.w2 + m.b) ** 2)

    ref, ref_grads = jax.value_and_grad(ref_loss)(model)
    ref_new = jax.tree.map(lambda p, g: p - 0.1 * (0.5 * g), model, ref_grads)
    np.testing.assert_allclose(float(loss), float(ref), rtol=1e-5)
    for got, want in ((grads, ref_grads), (new, ref_new)):
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(ref_grads.b).sum()) > 0     # the bias has a gradient to compare


def test_the_tree_map_mistake_mypy_reports_is_the_runtime_s_spmd103(mesh_dp_tp):
    """fail_pytrees.py's `jax.tree.map(lambda g: st.pmean(g, "dp"), grads)` (mypy:
    spmd-invariant-operand at its line): the gradients of a pmean'd loss are already
    Invariant over dp, and the runtime refuses the second reduction with the same code."""
    prog = _typing_program("pass_pytrees")
    model, specs, *_ = prog.build(jax.random.key(5))

    @st.shard_map(mesh=mesh_dp_tp, in_specs=(specs, P("dp")), out_specs=specs)
    def twice(m, xs):
        _, grads = prog.step_jax(m, xs)
        return jax.tree.map(lambda g: st.pmean(g, "dp"), grads)

    with pytest.raises(st.SpmdTypeError, match="st.pmean over 'dp'") as info:
        twice(_place(mesh_dp_tp, model, specs), put(mesh_dp_tp, _x(), P("dp")))
    assert info.value.code == "SPMD103"
