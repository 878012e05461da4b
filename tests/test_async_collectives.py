"""Asynchronous collectives (jax 0.12: `jax.lax.psum_scatter_start(...)` returns a future whose
`.done()` is the result; `psum_start`, `all_gather_start`, `all_to_all_start` and
`ppermute_start` are in `jax._src.lax.parallel`, as JAX's own `tests/overlap_test.py` uses
them). Each start is its collective's row (`_surface.collectives`: the same params, the same
rule) and each `done` passes the value on (`_rules.primitives.ASYNC_DONES`).

Found by running JAX's `overlap_test.py` through `typed_shard_map`: every async start was an
opaque computation (SPMD408 where JAX types the result Reduced). Here, the way serving code
overlaps communication: a tensor-parallel MLP whose row-parallel output is reduce-scattered
over the sequence while the next computation runs, on a dp x tp mesh, under `jax.jit`. The
right program equals one device on `typed_shard_map`, `checking(step)` and raw JAX, and
`infer` reports nothing; the bias added before the reduce-scatter is SPMD210 at its line on
the three faces and wrong in raw JAX. The same layer as an equinox module and as a flax nnx
module (jnp / jax.nn inside `__call__`, the weights a pytree argument, on a dp x sp x tp
mesh): equal to one device, and the bias bug SPMD210 at its line in `__call__`. The
collectives are not differentiable in JAX (no JVP rule), so only forward programs are tested.
Skipped where JAX has no async collectives (jax 0.10).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped.adapters import checking, infer, typed_shard_map

pytestmark = pytest.mark.skipif(not hasattr(jax.lax, "psum_scatter_start"),
                                reason="no asynchronous collectives in this JAX version")


def _parallel():   # JAX's own spelling of the other starts (tests/overlap_test.py)
    from jax._src.lax import parallel
    return parallel


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _inputs(mesh):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8, 16)).astype(np.float32)     # batch, seq, d
    w1 = rng.standard_normal((16, 32)).astype(np.float32) / 4
    w2 = rng.standard_normal((32, 16)).astype(np.float32) / 6
    b = rng.standard_normal((16,)).astype(np.float32)

    def on(a, spec):
        return jax.device_put(a, NamedSharding(mesh, spec))

    return (on(x, P("dp")), on(w1, P(None, "tp")), on(w2, P("tp", None)), on(b, P())), \
        (x, w1, w2, b)


SPECS = (P("dp"), P(None, "tp"), P("tp", None), P())
OUT = P("dp", "tp")    # the output's sequence reduce-scattered over tp


def mlp(x, w1, w2, b):
    h = jax.nn.gelu(x @ w1)                                   # column-parallel
    pending = jax.lax.psum_scatter_start(h @ w2, "tp", scatter_dimension=1, tiled=True)
    # while it is reduced: this device's rows of the residual stream
    rows = x.shape[1] // jax.lax.axis_size("tp")
    residual = jax.lax.dynamic_slice_in_dim(x, jax.lax.axis_index("tp") * rows, rows, axis=1)
    return residual + pending.done() + b


def mlp_bias_inside(x, w1, w2, b):
    h = jax.nn.gelu(x @ w1)
    pending = jax.lax.psum_scatter_start(h @ w2 + b, "tp", scatter_dimension=1, tiled=True)  # BUG
    return pending.done()


def reference(x, w1, w2, b):
    return x + jax.nn.gelu(x @ w1) @ w2 + b


def _bug_line() -> int:
    import inspect
    lines, start = inspect.getsourcelines(mlp_bias_inside)
    return start + next(i for i, text in enumerate(lines) if "# BUG" in text)


def _faces(body, mesh):
    def step(*args):
        return jax.shard_map(body, mesh=mesh, in_specs=SPECS, out_specs=OUT)(*args)

    return {"typed_shard_map": jax.jit(typed_shard_map(body, mesh=mesh, in_specs=SPECS,
                                                       out_specs=OUT)),
            "checking": checking(jax.jit(step)), "raw": jax.jit(step)}


def test_reduce_scatter_started_early_equals_one_device(mesh):
    args, host = _inputs(mesh)
    want = np.asarray(reference(*host))
    for name, face in _faces(mlp, mesh).items():
        np.testing.assert_allclose(np.asarray(face(*args)), want, rtol=2e-5, atol=2e-5,
                                   err_msg=name)
    assert not infer(mlp, *args, mesh=mesh, in_specs=SPECS, out_specs=OUT).violations


def test_bias_before_the_reduce_scatter_start(mesh):
    args, host = _inputs(mesh)
    faces = _faces(mlp_bias_inside, mesh)
    got = np.asarray(faces.pop("raw")(*args))
    x, w1, w2, b = host
    right = np.asarray(jax.nn.gelu(x @ w1) @ w2 + b)
    assert not np.allclose(got, right, atol=1e-3)   # b added once per tp device
    np.testing.assert_allclose(got, right + 3 * b, rtol=2e-5, atol=2e-5)
    for name, face in faces.items():
        with pytest.raises(st.SpmdTypeError) as ei:
            face(*args)
        assert (name, ei.value.code, ei.value.line) == (name, "SPMD210", _bug_line()), ei.value
    found = infer(mlp_bias_inside, *args, mesh=mesh, in_specs=SPECS, out_specs=OUT).violations
    assert [(v.code, v.line) for v in found][:1] == [("SPMD210", _bug_line())]


@pytest.mark.parametrize("name", ["psum", "all_gather", "all_gather_reduced", "all_to_all",
                                  "ppermute", "psum_of_psum"])
def test_each_start_is_its_collective(name):
    """Each async start gives what its synchronous collective gives, on `typed_shard_map` as in
    raw JAX (on an Explicit mesh: `to="reduced"` needs one); a start of a value already summed
    is SPMD103, as the synchronous psum is."""
    par = _parallel()
    if not hasattr(par, "psum_start"):
        pytest.skip("JAX's private async starts are not there")
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    x = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("tp")))
    pairs = {
        "psum": (lambda v: par.psum_start(v, "tp").done(), lambda v: jax.lax.psum(v, "tp"), P()),
        "all_gather": (lambda v: par.all_gather_start(v, "tp", tiled=True).done(),
                       lambda v: jax.lax.all_gather(v, "tp", tiled=True), P("tp")),
        "all_gather_reduced": (
            lambda v: par.all_gather_start(v, "tp", tiled=True, to="reduced").done(),
            lambda v: jax.lax.all_gather(v, "tp", tiled=True, to="reduced"),
            P(None, reduced={"tp"})),
        "all_to_all": (
            lambda v: par.all_to_all_start(v, "tp", split_axis=1, concat_axis=0,
                                           tiled=True).done(),
            lambda v: jax.lax.all_to_all(v, "tp", split_axis=1, concat_axis=0, tiled=True),
            P("tp")),
        "ppermute": (lambda v: par.ppermute_start(v, "tp", [(i, (i + 1) % 4) for i in range(4)]).done(),
                     lambda v: jax.lax.ppermute(v, "tp", [(i, (i + 1) % 4) for i in range(4)]),
                     P("tp")),
        "psum_of_psum": (lambda v: par.psum_start(jax.lax.psum(v, "tp"), "tp").done(), None, P()),
    }
    start, sync, out = pairs[name]
    typed = jax.jit(typed_shard_map(start, mesh=mesh, in_specs=P("tp"), out_specs=out))
    if sync is None:
        with pytest.raises(st.SpmdTypeError) as ei:
            typed(x)
        assert ei.value.code == "SPMD103"
        return
    want = jax.jit(jax.shard_map(sync, mesh=mesh, in_specs=P("tp"), out_specs=out))(x)
    np.testing.assert_array_equal(np.asarray(typed(x)), np.asarray(want))
    assert not infer(start, x, mesh=mesh, in_specs=P("tp"), out_specs=out).violations


# -- the same layer as an equinox module and a flax nnx module, the way those libraries'
#    users write it (a module called inside the shard_map'd step, its weights a pytree
#    argument whose in_specs follow the tree), on a 3-axis dp x sp x tp mesh

def _modules():
    eqx = pytest.importorskip("equinox")
    nnx = pytest.importorskip("flax.nnx")

    class EqxMLP(eqx.Module):
        w1: jax.Array
        w2: jax.Array
        b: jax.Array
        bias_inside: bool = eqx.field(static=True, default=False)

        def __call__(self, x):
            h = jax.nn.gelu(jnp.einsum("bsd,df->bsf", x, self.w1))
            y = jnp.einsum("bsf,fd->bsd", h, self.w2)
            if self.bias_inside:
                pending = jax.lax.psum_scatter_start(y + self.b, "tp", scatter_dimension=1, tiled=True)  # BUG eqx
                return pending.done()
            pending = jax.lax.psum_scatter_start(y, "tp", scatter_dimension=1, tiled=True)
            rows = x.shape[1] // jax.lax.axis_size("tp")
            start = jax.lax.axis_index("tp") * rows
            return jax.lax.dynamic_slice_in_dim(x, start, rows, axis=1) + pending.done() + self.b

    class NnxMLP(nnx.Module):
        def __init__(self, w1, w2, b, bias_inside=False):
            self.w1, self.w2, self.b = nnx.Param(w1), nnx.Param(w2), nnx.Param(b)
            self.bias_inside = bias_inside

        def __call__(self, x):
            h = jax.nn.gelu(x @ self.w1[...])
            y = h @ self.w2[...]
            if self.bias_inside:
                pending = jax.lax.psum_scatter_start(y + self.b[...], "tp", scatter_dimension=1, tiled=True)  # BUG nnx
                return pending.done()
            pending = jax.lax.psum_scatter_start(y, "tp", scatter_dimension=1, tiled=True)
            rows = x.shape[1] // jax.lax.axis_size("tp")
            start = jax.lax.axis_index("tp") * rows
            return jax.lax.dynamic_slice_in_dim(x, start, rows, axis=1) + pending.done() + self.b[...]

    return eqx, nnx, EqxMLP, NnxMLP


def _module_line(marker: str) -> int:
    import inspect
    lines, start = inspect.getsourcelines(_modules)
    return start + next(i for i, text in enumerate(lines) if marker in text)


MODULE_SPECS = {"w1": P(None, "tp"), "w2": P("tp", None), "b": P()}
X_SPEC, Y_SPEC = P(("dp", "sp")), P(("dp", "sp"), "tp")


def _module_step(lib: str, bias_inside: bool, face: str, mesh3):
    """A jitted step that calls the layer inside the shard_map, the layer's weights its
    argument (equinox: the module itself; nnx: `nnx.split`'s state, merged in the body);
    with its arguments on `mesh3` and on the host."""
    _eqx, nnx, EqxMLP, NnxMLP = _modules()
    _args, (x, w1, w2, b) = _inputs(mesh3)
    weights = (jnp.asarray(w1), jnp.asarray(w2), jnp.asarray(b))
    if lib == "eqx":
        params = EqxMLP(*weights, bias_inside)
        specs = EqxMLP(MODULE_SPECS["w1"], MODULE_SPECS["w2"], MODULE_SPECS["b"], bias_inside)

        def body(m, x):
            return m(x)
    else:
        graphdef, params = nnx.split(NnxMLP(*weights, bias_inside))
        specs = jax.tree_util.tree_map_with_path(
            lambda path, _leaf: MODULE_SPECS[str(path[0].key)], params)

        def body(state, x):
            return nnx.merge(graphdef, state)(x)

    def put(a, spec):
        return jax.device_put(a, NamedSharding(mesh3, spec))

    args = (jax.tree.map(put, params, specs), put(jnp.asarray(x), X_SPEC))
    if face == "typed_shard_map":
        step = jax.jit(typed_shard_map(body, mesh=mesh3, in_specs=(specs, X_SPEC),
                                       out_specs=Y_SPEC))
        return step, args, (x, w1, w2, b)
    step = jax.jit(jax.shard_map(body, mesh=mesh3, in_specs=(specs, X_SPEC), out_specs=Y_SPEC))
    return (checking(step) if face == "checking" else step), args, (x, w1, w2, b)


@pytest.fixture(scope="module")
def mesh3():
    return jax.make_mesh((1, 2, 4), ("dp", "sp", "tp"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 3)


@pytest.mark.parametrize("lib", ["eqx", "nnx"])
def test_module_layer_equals_one_device(lib, mesh3):
    """The right layer, as an equinox / nnx module: equal to one device on both faces and
    in raw JAX."""
    for face in ("typed_shard_map", "checking", "raw"):
        step, args, host = _module_step(lib, False, face, mesh3)
        np.testing.assert_allclose(np.asarray(step(*args)), np.asarray(reference(*host)),
                                   rtol=2e-5, atol=2e-5, err_msg=f"{lib} {face}")


@pytest.mark.parametrize("lib", ["eqx", "nnx"])
def test_module_bias_before_the_reduce_scatter_start(lib, mesh3):
    """The bias added before the start, in the module's `__call__`: SPMD210 at that line on
    both faces; raw JAX adds it once per tp device."""
    step, args, (x, w1, w2, b) = _module_step(lib, True, "raw", mesh3)
    right = np.asarray(jax.nn.gelu(x @ w1) @ w2 + b)
    np.testing.assert_allclose(np.asarray(step(*args)), right + 3 * b, rtol=2e-5, atol=2e-5)
    for face in ("typed_shard_map", "checking"):
        step, args, _host = _module_step(lib, True, face, mesh3)
        with pytest.raises(st.SpmdTypeError) as ei:
            step(*args)
        assert (face, ei.value.code, ei.value.line) == \
            (face, "SPMD210", _module_line(f"# BUG {lib}")), ei.value
