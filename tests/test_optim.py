"""`st.global_norm` / `st.clip_by_global_norm` equal the single-device optax result under dp, tp,
FSDP and partial (Unreduced) layouts; optax transformations run unchanged on typed values."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import put
from jax.sharding import PartitionSpec as P

import spmdtyped as st

optax = pytest.importorskip("optax")


def _grads():
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(3), 3)
    return {"w1": jax.random.normal(k1, (8, 16)), "w2": jax.random.normal(k2, (16, 8)),
            "b": jax.random.normal(k3, (8,))}


LAYOUTS = {
    "dp": {"w1": P(), "w2": P(), "b": P()},
    "tp": {"w1": P(None, "tp"), "w2": P("tp", None), "b": P()},
    "fsdp": {"w1": P("dp"), "w2": P("dp"), "b": P()},
    "fsdp_tp": {"w1": P("dp", "tp"), "w2": P("tp", "dp"), "b": P("tp")},
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("max_norm", [1.0, 1e4])
def test_clip_by_global_norm_equals_single_device(mesh_dp_tp, layout, max_norm):
    grads = _grads()
    specs = LAYOUTS[layout]
    clip = st.clip_by_global_norm(max_norm)

    def f(g):
        upd, _ = clip.update(g, clip.init(g))
        return upd, st.global_norm(g)

    sharded = {k: put(mesh_dp_tp, v, specs[k]) for k, v in grads.items()}
    upd, norm = jax.jit(st.shard_map(f, mesh=mesh_dp_tp, in_specs=(specs,), out_specs=(specs, P())))(sharded)
    ref_norm = optax.global_norm(grads)
    ref, _ = optax.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
    np.testing.assert_allclose(float(norm), float(ref_norm), rtol=1e-6)
    for k in grads:
        np.testing.assert_allclose(np.asarray(upd[k]), np.asarray(ref[k]), rtol=1e-6, atol=1e-7)
    if max_norm == 1.0:  # the clipping happened
        total = sum(float(np.sum(np.asarray(v) ** 2)) for v in upd.values())
        assert total ** 0.5 == pytest.approx(1.0, rel=1e-5)


def test_global_norm_of_partial_and_raw_leaves(mesh_dp_tp):
    grads = _grads()

    def f(g):
        # w2 as partial sums over tp (a quarter on each device), w1 a raw JAX value
        part = st.pcast(st.pvary(g["w2"] / 4.0, "tp"), "tp", to="unreduced")
        tree = {"w1": st.unwrap(g["w1"]), "w2": part, "b": g["b"]}
        upd, _ = st.clip_by_global_norm(1.0).update(tree, None)
        return st.global_norm(tree), st.psum(upd["w2"], "tp")

    norm, w2 = st.shard_map(f, mesh=mesh_dp_tp, in_specs=(P(),), out_specs=(P(), P()))(
        {k: put(mesh_dp_tp, v) for k, v in grads.items()})
    np.testing.assert_allclose(float(norm), float(optax.global_norm(grads)), rtol=1e-6)
    ref, _ = optax.clip_by_global_norm(1.0).update(grads, optax.EmptyState())
    np.testing.assert_allclose(np.asarray(w2), np.asarray(ref["w2"]), rtol=1e-5, atol=1e-6)


def test_optax_adamw_chain_runs_on_typed_params_and_matches_reference(mesh_dp_tp):
    params = _grads()
    grads = jax.tree.map(lambda p: jnp.sin(3.0 * p), params)
    specs = LAYOUTS["tp"]
    opt = optax.chain(st.clip_by_global_norm(0.5), optax.adamw(1e-2, weight_decay=0.1))
    ref_opt = optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(1e-2, weight_decay=0.1))
    state = opt.init(params)
    state_specs = optax.tree_utils.tree_map_params(opt, lambda _p, s: s, state, specs,
                                                   transform_non_params=lambda _: P())

    def step(p, s, g):
        upd, s = opt.update(g, s, p)
        return optax.apply_updates(p, upd), s

    f = jax.jit(st.shard_map(step, mesh=mesh_dp_tp, in_specs=(specs, state_specs, specs),
                             out_specs=(specs, state_specs)))
    p_sh = {k: put(mesh_dp_tp, v, specs[k]) for k, v in params.items()}
    g_sh = {k: put(mesh_dp_tp, v, specs[k]) for k, v in grads.items()}
    s_sh = jax.tree.map(lambda x, sp: put(mesh_dp_tp, x, sp), state, state_specs)
    ref_p, ref_s = params, ref_opt.init(params)
    for _ in range(3):
        p_sh, s_sh = f(p_sh, s_sh, g_sh)
        upd, ref_s = ref_opt.update(grads, ref_s, ref_p)
        ref_p = optax.apply_updates(ref_p, upd)
    for k in params:
        assert type(p_sh[k]) is type(ref_p[k])  # plain jax.Array out of st.shard_map
        np.testing.assert_allclose(np.asarray(p_sh[k]), np.asarray(ref_p[k]), rtol=1e-5, atol=1e-6)


def test_clip_without_optax_is_a_clear_error(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_optax(name, *a, **kw):
        if name == "optax":
            raise ImportError("no optax")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_optax)
    with pytest.raises(st.SpmdTypeError, match="ecosystem") as ei:
        st.clip_by_global_norm(1.0)
    assert ei.value.code == "SPMD504"
