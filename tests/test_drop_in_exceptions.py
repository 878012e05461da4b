"""The drop-in keeps JAX's exception classes: where `typed_shard_map` or `checking(step)`
raises spmdtyped's error in place of one JAX raises, the error is also an instance of JAX's
class (`_errors.raised_as`). Code that catches JAX's `ValueError` around a `jax.shard_map` call
(a fallback to a replicated layout, a notebook's `except ValueError: print(e)`) keeps working
when the call is ported. Where spmdtyped finds a bug JAX accepts, the error is spmdtyped's
alone (a TypeError, `st.SpmdTypeError`).

Found by running JAX's `docs/notebooks/shard_map.md` through `typed_shard_map`: its argument
against its in_spec raised `BoundaryError`, a TypeError, where JAX raises a ValueError.
"""

from __future__ import annotations

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped.adapters import checking, typed_shard_map


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)


def _faces(body, mesh, in_specs, out_specs):
    def step(*args):
        return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)(*args)

    return {"raw": jax.jit(step),
            "typed_shard_map": jax.jit(typed_shard_map(body, mesh=mesh, in_specs=in_specs,
                                                       out_specs=out_specs)),
            "checking": checking(jax.jit(step))}


def _sharded_or_replicated(step, x):
    """User code: try the sharded step, fall back to a replicated copy of `x` when JAX refuses
    its layout (what `except ValueError` around a shard_map call is written for)."""
    try:
        return step(x), "sharded"
    except ValueError as e:
        return e, "fallback"


def test_an_argument_against_its_in_spec_is_still_a_value_error(mesh):
    x = jnp.arange(32.0).reshape(8, 4)      # not sharded over dp, as its in_spec says
    for name, step in _faces(lambda v: v * 2, mesh, P("dp"), P("dp")).items():
        got, how = _sharded_or_replicated(step, x)
        assert how == "fallback", name
        if name != "raw":
            assert isinstance(got, st.SpmdTypeError) and got.code == "SPMD403", (name, got)
            assert isinstance(got, TypeError) and type(got).__name__ == "BoundaryError"


def test_an_output_that_fails_its_out_spec_is_still_a_value_error(mesh):
    x = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh, P("dp")))
    for name, step in _faces(lambda v: v * 2, mesh, P("dp"), P()).items():
        with pytest.raises(ValueError) as ei:
            step(x)
        if name != "raw":
            assert ei.value.code == "SPMD401", (name, ei.value)


def test_a_collective_of_a_reduced_value_is_still_a_value_error(mesh):
    """JAX: "psum cannot accept args which are reduced", a ValueError; spmdtyped: SPMD101."""
    x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P(None, reduced={"tp"})))

    def body(v):
        return jax.lax.psum(v, "tp")

    for name, step in _faces(body, mesh, P(None, reduced={"tp"}), P()).items():
        with pytest.raises(ValueError) as ei:
            step(x)
        if name != "raw":
            assert ei.value.code == "SPMD101", (name, ei.value)


def test_a_replicated_input_mixed_with_a_reduced_one_keeps_jaxs_class():
    """JAX: "Inputs cannot be replicated on the same axes that another input is reduced on",
    its own `ShardingTypeError` (not exported; JAX's `pjit_test.py` asserts it around a
    shard_map); spmdtyped: SPMD203, an instance of JAX's class too."""
    mesh = jax.make_mesh((2, 2), ("x", "y"), axis_types=(jax.sharding.AxisType.Explicit,) * 2,
                         devices=jax.devices()[:4])
    arr1 = jax.device_put(np.arange(8.0).reshape(4, 2), NamedSharding(mesh, P("x", reduced={"y"})))
    arr2 = jax.device_put(np.arange(8.0).reshape(4, 2), NamedSharding(mesh, P("x", None)))

    def f(x, y):
        return jax.lax.add(x, y).sum()

    with jax.set_mesh(mesh):
        with pytest.raises(Exception) as raw:
            jax.jit(jax.shard_map(f, out_specs=P()))(arr1, arr2)
        jax_cls = type(raw.value)
        assert jax_cls.__name__ == "ShardingTypeError"
        with pytest.raises(jax_cls) as got:
            jax.jit(typed_shard_map(f, out_specs=P()))(arr1, arr2)
    assert got.value.code == "SPMD203" and isinstance(got.value, st.SpmdTypeError)


def test_a_bug_jax_accepts_is_spmdtypeds_alone(mesh):
    """The bias added before the psum of a row-parallel projection: JAX computes it (wrong),
    spmdtyped raises SPMD210, a TypeError that `except ValueError` does not catch."""
    rng = np.random.default_rng(0)
    x = jax.device_put(rng.standard_normal((8, 16), np.float32), NamedSharding(mesh, P("dp", "tp")))
    w = jax.device_put(rng.standard_normal((16, 4), np.float32), NamedSharding(mesh, P("tp")))
    b = jax.device_put(np.ones(4, np.float32), NamedSharding(mesh, P()))

    def body(x, w, b):
        return jax.lax.psum(x @ w + b, "tp")

    faces = _faces(body, mesh, (P("dp", "tp"), P("tp"), P()), P("dp"))
    faces.pop("raw")(x, w, b)
    for name, step in faces.items():
        with pytest.raises(st.SpmdTypeError) as ei:
            step(x, w, b)
        assert ei.value.code == "SPMD210" and not isinstance(ei.value, ValueError), name


def test_the_kept_class_survives_pickle_and_a_second_error(mesh):
    x = jnp.arange(32.0).reshape(8, 4)
    step = jax.jit(typed_shard_map(lambda v: v, mesh=mesh, in_specs=P("dp"), out_specs=P("dp")))
    with pytest.raises(ValueError) as ei:
        step(x)
    again = pickle.loads(pickle.dumps(ei.value))
    assert isinstance(again, ValueError) and isinstance(again, st.SpmdTypeError)
    assert again.code == "SPMD403" and str(again) == str(ei.value)
    assert type(again) is type(ei.value)


def test_only_plain_classes_are_kept():
    """Python's classes of the plain layout and message only: a NameError (its `name` field)
    or a KeyError (it quotes its message) raised by JAX leaves spmdtyped's error as it is, and
    so does JAX's internal AssertionError."""
    from spmdtyped._errors import error, jax_class, raised_as

    for cls, kept in ((ValueError, True), (IndexError, True), (NotImplementedError, True),
                      (NameError, False), (KeyError, False), (AssertionError, False)):
        err = raised_as(error("SPMD501", "an axis the mesh lacks"), cls("JAX's message"))
        assert isinstance(err, cls) is kept, cls
        assert (jax_class(err) is cls) is kept and err.code == "SPMD501"
        assert str(err).startswith("an axis the mesh lacks"), str(err)
