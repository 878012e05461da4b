"""The refinement on production patterns (issue 24, item 1): the silent bug classes of the
issue's "Refinement gaps", each as a buggy and a fixed raw-JAX program written the way
production code is (jax.lax spelling, nested parameter dicts, a 2 x 2 x 2 mesh, check_vma=True):

1. a `pmean` over an axis of gradient slices an in_spec shards over it, combined with the
   parameter slices and sharded over it again by the out_spec (an optimizer step in its own
   shard_map): SPMD108;
2. a `psum` right after an `all_gather` over the same axis (a token count of a gathered mask):
   SPMD103;
3. a `pmean` right after a tiled `psum_scatter` over the same axis (FSDP's gradient
   reduce-scatter, then the data-parallel mean over both axes): SPMD108;
4. a ring expert-parallel MoE combine (tokens gathered over `expert`, routed locally by
   `axis_index` and argsort, `jax.lax.ragged_dot`, scatter-added into a zero buffer,
   `psum_scatter` back): the residual added before the reduction (SPMD210), and the reduction
   replaced by a slice at `axis_index` (SPMD213).

Each buggy program: `infer` reports the code at the `# BUG` line, `typed_shard_map` and
`st.shard_map` with the raw body raise it there. Each fixed program passes all three and
equals a single-device reference (values, and gradients where the program has them). Under
`st.shard_map(..., strict=True)` class 1 is reported without the out_spec's help.
"""

from __future__ import annotations

import functools
import inspect
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import spmdtyped as st

RTOL = ATOL = 2e-5

MESH = jax.make_mesh((2, 2, 2), ("dp", "fsdp", "tp"), axis_types=(AxisType.Auto,) * 3)
MOE_MESH = jax.make_mesh((2, 2, 2), ("data", "fsdp", "expert"),
                         axis_types=(AxisType.Auto,) * 3)
D, F = 8, 16


def _keys(n, seed=0):
    return jax.random.split(jax.random.key(seed), n)


# ------------------------------------------------------------------ 1: an optimizer step


UPDATE_IN = ({"mlp": {"w_in": P("fsdp", "tp"), "w_out": P("tp", "fsdp")}},
             {"mlp": {"w_in": P("dp", "fsdp", "tp"), "w_out": P("dp", "tp", "fsdp")}})
UPDATE_OUT = {"mlp": {"w_in": P("fsdp", "tp"), "w_out": P("tp", "fsdp")}}


def update_inputs():
    k = _keys(4)
    params = {"mlp": {"w_in": jax.random.normal(k[0], (D, F)),
                      "w_out": jax.random.normal(k[1], (F, D))}}
    # per-replica gradients from the backward step, stacked over dp (each replica's a slice
    # of the global gradient over fsdp and tp)
    grads = {"mlp": {"w_in": jax.random.normal(k[2], (2, D, F)),
                     "w_out": jax.random.normal(k[3], (2, F, D))}}
    return params, grads


def update_fixed(params, grads, lr=0.1):
    def sgd(p, g):
        g = jax.lax.pmean(g[0], "dp")      # average the replicas' gradients
        return p - lr * g
    return {"mlp": {k: sgd(params["mlp"][k], grads["mlp"][k]) for k in ("w_in", "w_out")}}


def update_buggy(params, grads, lr=0.1):
    def sgd(p, g):
        g = jax.lax.pmean(g[0], ("dp", "fsdp"))  # BUG SPMD108: averages different fsdp slices
        return p - lr * g
    return {"mlp": {k: sgd(params["mlp"][k], grads["mlp"][k]) for k in ("w_in", "w_out")}}


def update_reference(params, grads, lr=0.1):
    return jax.tree.map(lambda p, g: p - lr * g.mean(0), params, grads)


# ------------------------------------------------------------------ 2: a gathered mask summed


LOSS_IN = ({"mlp": {"w_in": P("fsdp", "tp"), "w_out": P("tp", "fsdp")}},
           P(("dp", "fsdp")), P(("dp", "fsdp")), P(("dp", "fsdp")))
LOSS_OUT = (P(), {"mlp": {"w_in": P("fsdp", "tp"), "w_out": P("tp", "fsdp")}})


def loss_inputs():
    k = _keys(5, 1)
    params = {"mlp": {"w_in": jax.random.normal(k[0], (D, F)) / 3,
                      "w_out": jax.random.normal(k[1], (F, D)) / 4}}
    x = jax.random.normal(k[2], (16, D))
    y = jax.random.normal(k[3], (16, D))
    mask = (jax.random.uniform(k[4], (16,)) > 0.3).astype(jnp.float32)
    return params, x, y, mask


def _forward(params, x):
    w_in = jax.lax.all_gather(params["mlp"]["w_in"], "fsdp", axis=0, tiled=True)
    w_out = jax.lax.all_gather(params["mlp"]["w_out"], "fsdp", axis=1, tiled=True)
    h = jax.nn.gelu(x @ w_in)
    return jax.lax.psum(h @ w_out, "tp")


def loss_fixed(params, x, y, mask):
    def loss(params):
        err = jnp.sum(jnp.sum((_forward(params, x) - y) ** 2, -1) * mask)
        count = jax.lax.psum(jnp.sum(mask), ("dp", "fsdp"))    # the batch's tokens
        return jax.lax.psum(err, ("dp", "fsdp")) / count
    return jax.value_and_grad(loss)(params)


def loss_buggy(params, x, y, mask):
    def loss(params):
        err = jnp.sum(jnp.sum((_forward(params, x) - y) ** 2, -1) * mask)
        full_mask = jax.lax.all_gather(mask, ("dp", "fsdp"), tiled=True)  # the batch's mask
        count = jax.lax.psum(jnp.sum(full_mask), ("dp", "fsdp"))  # BUG SPMD103: 4x the count
        return jax.lax.psum(err, ("dp", "fsdp")) / count
    return jax.value_and_grad(loss)(params)


def loss_reference(params, x, y, mask):
    def loss(params):
        h = jax.nn.gelu(x @ params["mlp"]["w_in"])
        err = jnp.sum(jnp.sum((h @ params["mlp"]["w_out"] - y) ** 2, -1) * mask)
        return err / jnp.sum(mask)
    return jax.value_and_grad(loss)(params)


# ------------------------------------------------------------------ 3: FSDP's gradient reduce


STEP_IN = ({"mlp": {"w_in": P("fsdp", "tp"), "w_out": P("tp", "fsdp")}},
           P(("dp", "fsdp")), P(("dp", "fsdp")))
STEP_OUT = (P(), {"mlp": {"w_in": P("fsdp", "tp"), "w_out": P("tp", "fsdp")}})


def step_inputs():
    params, x, y, _mask = loss_inputs()
    return params, x, y


def _local_loss(full, x, y):
    h = jax.nn.gelu(x @ full["mlp"]["w_in"])
    pred = jax.lax.psum(h @ full["mlp"]["w_out"], "tp")
    return jnp.mean((pred - y) ** 2)


def _gathered(params):
    # per-replica gradients (reduced over dp explicitly below): the weights cast to varying
    # over dp, gathered over fsdp
    local = jax.tree.map(lambda w: jax.lax.pcast(w, "dp", to="varying"), params)
    return {"mlp": {"w_in": jax.lax.all_gather(local["mlp"]["w_in"], "fsdp", axis=0, tiled=True),
                    "w_out": jax.lax.all_gather(local["mlp"]["w_out"], "fsdp", axis=1,
                                                tiled=True)}}


def step_fixed(params, x, y):
    full = _gathered(params)
    loss, g_full = jax.value_and_grad(_local_loss)(full, x, y)   # this device's batch
    n = jax.lax.axis_size("fsdp")
    g_in = jax.lax.psum_scatter(g_full["mlp"]["w_in"], "fsdp", scatter_dimension=0, tiled=True)
    g_out = jax.lax.psum_scatter(g_full["mlp"]["w_out"], "fsdp", scatter_dimension=1, tiled=True)
    grads = {"mlp": {"w_in": jax.lax.pmean(g_in / n, "dp"),
                     "w_out": jax.lax.pmean(g_out / n, "dp")}}
    return jax.lax.pmean(loss, ("dp", "fsdp")), grads


def step_buggy(params, x, y):
    full = _gathered(params)
    loss, g_full = jax.value_and_grad(_local_loss)(full, x, y)   # this device's batch
    n = jax.lax.axis_size("fsdp")
    g_in = jax.lax.psum_scatter(g_full["mlp"]["w_in"], "fsdp", scatter_dimension=0, tiled=True)
    g_out = jax.lax.psum_scatter(g_full["mlp"]["w_out"], "fsdp", scatter_dimension=1, tiled=True)
    grads = {"mlp": {"w_in": jax.lax.pmean(g_in / n, ("dp", "fsdp")),  # BUG SPMD108
                     "w_out": jax.lax.pmean(g_out / n, "dp")}}
    return jax.lax.pmean(loss, ("dp", "fsdp")), grads


def step_reference(params, x, y):
    def loss(params):
        h = jax.nn.gelu(x.reshape(4, 4, D) @ params["mlp"]["w_in"])
        return jnp.mean(jnp.mean((h @ params["mlp"]["w_out"] - y.reshape(4, 4, D)) ** 2,
                                 axis=(1, 2)))
    return jax.value_and_grad(loss)(params)


# ------------------------------------------------------------------ 4: a ring MoE combine


E, E_LOCAL, T_LOCAL = 4, 2, 2
MOE_IN = ({"router": P(), "experts": {"w_up": P("expert"), "w_down": P("expert")}},
          P(("data", "fsdp", "expert")))
MOE_OUT = P(("data", "fsdp", "expert"))


def moe_inputs():
    k = _keys(4, 2)
    params = {"router": jax.random.normal(k[0], (D, E)),
              "experts": {"w_up": jax.random.normal(k[1], (E, D, F)) / 3,
                          "w_down": jax.random.normal(k[2], (E, F, D)) / 4}}
    return params, jax.random.normal(k[3], (8 * T_LOCAL, D))


def _routed(params, x_all, buffer=None):
    """This device's experts on the tokens routed to them, scatter-added into a zero buffer
    (or `buffer`) in token order: per-device contributions to the combine."""
    probs = jax.nn.softmax(x_all @ params["router"], axis=-1)
    expert = jnp.argmax(probs, axis=-1)
    gate = jnp.take_along_axis(probs, expert[:, None], axis=-1)
    local = expert - jax.lax.axis_index("expert") * E_LOCAL
    slot = jnp.where((local >= 0) & (local < E_LOCAL), local, E_LOCAL)
    order = jnp.argsort(slot)
    sizes = jnp.bincount(slot, length=E_LOCAL + 1)[:E_LOCAL].astype(jnp.int32)
    h = jax.nn.gelu(jax.lax.ragged_dot(x_all[order], params["experts"]["w_up"], sizes))
    rows = jax.lax.ragged_dot(h, params["experts"]["w_down"], sizes) * gate[order]
    return (jnp.zeros_like(x_all) if buffer is None else buffer).at[order].add(rows)


def moe_fixed(params, x):
    x_all = jax.lax.all_gather(x, "expert", axis=0, tiled=True)
    out = _routed(params, x_all)
    return jax.lax.psum_scatter(out, "expert", scatter_dimension=0, tiled=True) + x


def moe_buggy_residual(params, x):
    x_all = jax.lax.all_gather(x, "expert", axis=0, tiled=True)
    out = _routed(params, x_all)
    return jax.lax.psum_scatter(out + x_all, "expert", scatter_dimension=0, tiled=True)  # BUG SPMD210


def moe_buggy_slice(params, x):
    x_all = jax.lax.all_gather(x, "expert", axis=0, tiled=True)
    out = _routed(params, x_all)
    start = jax.lax.axis_index("expert") * T_LOCAL
    return jax.lax.dynamic_slice_in_dim(out, start, T_LOCAL, axis=0) + x  # BUG SPMD213


def moe_reference(params, x):
    probs = jax.nn.softmax(x @ params["router"], axis=-1)
    expert = jnp.argmax(probs, axis=-1)
    gate = jnp.take_along_axis(probs, expert[:, None], axis=-1)
    w_up, w_down = params["experts"]["w_up"][expert], params["experts"]["w_down"][expert]
    h = jax.nn.gelu(jnp.einsum("td,tdf->tf", x, w_up))
    return jnp.einsum("tf,tfd->td", h, w_down) * gate + x


def moe_loss(fn):
    return jax.grad(lambda params, x: jnp.sum(fn(params, x) ** 2))


# ------------------------------------------------------------------ the table


@functools.cache
def _cases():
    return {
        "optimizer_step_slices_averaged": (update_buggy, update_fixed, update_reference,
                                           update_inputs, MESH, UPDATE_IN, UPDATE_OUT, None),
        "gathered_mask_summed": (loss_buggy, loss_fixed, loss_reference, loss_inputs, MESH,
                                 LOSS_IN, LOSS_OUT, None),
        "reduce_scatter_then_mean": (step_buggy, step_fixed, step_reference, step_inputs, MESH,
                                     STEP_IN, STEP_OUT, None),
        "moe_residual_before_combine": (moe_buggy_residual, moe_fixed, moe_reference,
                                        moe_inputs, MOE_MESH, MOE_IN, MOE_OUT, moe_loss),
        "moe_combine_sliced": (moe_buggy_slice, moe_fixed, moe_reference, moe_inputs, MOE_MESH,
                               MOE_IN, MOE_OUT, moe_loss),
    }


CASES = list(_cases())


def _bug_line(fn):
    """The `# BUG SPMDxxx` line of `fn` (its file, line and code)."""
    lines, start = inspect.getsourcelines(fn)
    for i, text in enumerate(lines):
        if "# BUG " in text:
            return inspect.getsourcefile(fn), start + i, text.split("# BUG ")[1].split(":")[0].split()[0]
    raise AssertionError(f"{fn.__name__} has no # BUG line")


def _face(face, body, mesh, in_specs, out_specs, **kw):
    if face == "typed_shard_map":
        return st.adapters.typed_shard_map(body, mesh=mesh, in_specs=in_specs,
                                           out_specs=out_specs)
    return st.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **kw)


def _same_file(a, b):
    return a is not None and pathlib.Path(a).resolve() == pathlib.Path(b).resolve()


@pytest.mark.parametrize("name", CASES)
def test_infer_reports_the_bug_at_its_line(name):
    buggy, _fixed, _ref, inputs, mesh, ins, outs, _grad = _cases()[name]
    path, line, code = _bug_line(buggy)
    rep = st.adapters.infer(buggy, *inputs(), mesh=mesh, in_specs=ins, out_specs=outs)
    assert not rep.ok
    first = rep.violations[0]
    assert (first.code, first.line) == (code, line), [(v.code, v.line) for v in rep.violations]
    assert _same_file(first.file, path)


@pytest.mark.parametrize("face", ["typed_shard_map", "st.shard_map"])
@pytest.mark.parametrize("name", CASES)
def test_the_runtimes_raise_the_bug_at_its_line(name, face):
    buggy, _fixed, _ref, inputs, mesh, ins, outs, _grad = _cases()[name]
    path, line, code = _bug_line(buggy)
    with pytest.raises(st.SpmdTypeError) as ei:
        jax.jit(_face(face, buggy, mesh, ins, outs))(*inputs())
    e = ei.value
    assert (e.code, getattr(e, "line", None)) == (code, line), str(e)
    assert _same_file(getattr(e, "file", None), path)


@pytest.mark.parametrize("name", CASES)
def test_the_buggy_program_is_silently_wrong_under_jax(name):
    """The class is a silent bug: JAX runs it, and the numbers differ from the reference."""
    buggy, _fixed, ref, inputs, mesh, ins, outs, _grad = _cases()[name]
    got = jax.jit(jax.shard_map(buggy, mesh=mesh, in_specs=ins, out_specs=outs))(*inputs())
    want = ref(*inputs())
    assert any(not np.allclose(np.asarray(g), np.asarray(w), rtol=1e-3, atol=1e-3)
               for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True))


def _check_equal(got, want):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", CASES)
def test_the_fixed_program_passes_infer(name):
    _buggy, fixed, _ref, inputs, mesh, ins, outs, _grad = _cases()[name]
    rep = st.adapters.infer(fixed, *inputs(), mesh=mesh, in_specs=ins, out_specs=outs)
    assert rep.ok, [str(v) for v in rep.violations]


@pytest.mark.parametrize("face", ["typed_shard_map", "st.shard_map", "jax.shard_map"])
@pytest.mark.parametrize("name", CASES)
def test_the_fixed_program_runs_and_equals_the_reference(name, face):
    _buggy, fixed, ref, inputs, mesh, ins, outs, grad = _cases()[name]
    fn = (jax.shard_map(fixed, mesh=mesh, in_specs=ins, out_specs=outs)
          if face == "jax.shard_map" else _face(face, fixed, mesh, ins, outs))
    _check_equal(jax.jit(fn)(*inputs()), ref(*inputs()))
    if grad is not None:   # the gradient through the shard_map, against the reference's
        _check_equal(jax.jit(grad(fn))(*inputs()), grad(ref)(*inputs()))


def test_strict_reports_a_sum_of_in_spec_shards_without_the_out_spec():
    """The out_spec is what tells a slice from a stack: the same optimizer step returning the
    averaged gradient replicated (out_specs P()) is a stack's mean by default, and SPMD108
    under `strict=True`."""
    def mean_grads(grads):
        return {"mlp": {k: jax.lax.pmean(g[0], ("dp", "fsdp")) for k, g in grads["mlp"].items()}}

    _params, grads = update_inputs()
    ins, outs = (UPDATE_IN[1],), {"mlp": {"w_in": P(None, "tp"), "w_out": P("tp", None)}}
    rep = st.adapters.infer(mean_grads, grads, mesh=MESH, in_specs=ins, out_specs=outs)
    assert rep.ok, [str(v) for v in rep.violations]
    jax.jit(st.shard_map(mean_grads, mesh=MESH, in_specs=ins, out_specs=outs))(grads)
    with pytest.raises(st.SpmdTypeError) as ei:
        jax.jit(st.shard_map(mean_grads, mesh=MESH, in_specs=ins, out_specs=outs,
                             strict=True))(grads)
    assert ei.value.code == "SPMD108"
    assert "strict=True" in str(ei.value) and "'fsdp'" in str(ei.value)


def test_a_cast_is_not_a_gather():
    """`psum(pvary(x))` is how a program asks for n * x (SPMD103's opt-out): only a gathered
    value's content is checked, not a cast one's."""
    def body(x):
        return jax.lax.psum(jax.lax.pcast(x, "tp", to="varying"), "tp")

    x = jnp.arange(4.0)
    rep = st.adapters.infer(body, x, mesh=MESH, in_specs=P(), out_specs=P())
    assert rep.ok, [str(v) for v in rep.violations]


def test_allow_opts_out_of_each_code():
    """Each rule has the refinement's one-line opt-out (`with st.allow(code):`)."""
    def body(params, x, y, mask):
        with st.allow("SPMD103"):
            return loss_buggy(params, x, y, mask)

    jax.jit(st.shard_map(body, mesh=MESH, in_specs=LOSS_IN, out_specs=LOSS_OUT))(*loss_inputs())


FRAGMENTS = {
    "optimizer_step_slices_averaged": ("jax.lax.psum", "slice of a global array", "'fsdp'",
                                       "sharded over it again by its out_spec"),
    "gathered_mask_summed": ("result of an all_gather over", "(Rep)", "double count"),
    "reduce_scatter_then_mean": ("tiled psum_scatter", "'fsdp'", "all_gather(x, 'fsdp'"),
    "moe_residual_before_combine": ("a gathered value replicated over 'expert'",
                                    "counted once per device", "psum_scatter"),
    "moe_combine_sliced": ("sliced at this device's axis_index", "'expert'",
                           "psum_scatter(acc, 'expert'"),
}


@pytest.mark.parametrize("name", CASES)
def test_each_message_says_what_the_program_shows(name):
    """The message names the axis, what tells the class apart, and the fix (error-message style
    of tests/test_error_messages.py: code + fragments, docs anchor)."""
    buggy, _fixed, _ref, inputs, mesh, ins, outs, _grad = _cases()[name]
    rep = st.adapters.infer(buggy, *inputs(), mesh=mesh, in_specs=ins, out_specs=outs)
    text = str(rep.violations[0])
    for fragment in FRAGMENTS[name]:
        assert fragment in text, (fragment, text)
    assert f"errors/{rep.violations[0].code}" in text


def test_ragged_dot_rows_plus_a_residual_before_their_reduction():
    """The rows `ragged_dot` computes with this device's experts are contributions too: the
    residual added to them before the psum_scatter is SPMD210 (after it: accepted)."""
    def combine(params, x, residual_first):
        x_all = jax.lax.all_gather(x, "expert", axis=0, tiled=True)
        sizes = jnp.full((E_LOCAL,), x_all.shape[0] // E_LOCAL, jnp.int32)
        rows = jax.lax.ragged_dot(x_all, params["experts"]["w_up"][:, :, :D], sizes)
        if residual_first:
            return jax.lax.psum_scatter(rows + x_all, "expert", tiled=True)
        return jax.lax.psum_scatter(rows, "expert", tiled=True) + x

    params, x = moe_inputs()
    params = {"experts": {"w_up": params["experts"]["w_up"]}}
    ins = ({"experts": {"w_up": P("expert")}}, MOE_OUT)
    for first, codes in ((True, ["SPMD210"]), (False, [])):
        rep = st.adapters.infer(functools.partial(combine, residual_first=first), params, x,
                                mesh=MOE_MESH, in_specs=ins, out_specs=MOE_OUT)
        assert [v.code for v in rep.violations] == codes


def test_contributions_scatter_added_into_the_residual_before_their_reduction():
    """Scatter-adding the routed rows into the gathered tokens (`x_all.at[order].add(rows)`)
    instead of a zero buffer adds the residual before the psum_scatter: SPMD210 at the
    scatter-add's line, under `infer` and the drop-in; with the zero buffer and the residual
    added after, accepted. The bug is real: its numbers differ from one device's."""
    def combine(params, x, into_residual):
        x_all = jax.lax.all_gather(x, "expert", axis=0, tiled=True)
        if into_residual:
            out = _routed(params, x_all, buffer=x_all)
            return jax.lax.psum_scatter(out, "expert", scatter_dimension=0, tiled=True)
        out = _routed(params, x_all)
        return jax.lax.psum_scatter(out, "expert", scatter_dimension=0, tiled=True) + x

    params, x = moe_inputs()
    src, first = inspect.getsourcelines(_routed)
    line = first + next(i for i, text in enumerate(src) if ".at[order].add" in text)
    for into, codes in ((True, ["SPMD210"]), (False, [])):
        fn = functools.partial(combine, into_residual=into)
        rep = st.adapters.infer(fn, params, x, mesh=MOE_MESH, in_specs=MOE_IN, out_specs=MOE_OUT)
        assert [v.code for v in rep.violations] == codes, [str(v) for v in rep.violations]
        if into:
            assert f":{line}" in str(rep.violations[0]), str(rep.violations[0])
            with pytest.raises(st.SpmdTypeError, match="SPMD210"):
                st.adapters.typed_shard_map(fn, mesh=MOE_MESH, in_specs=MOE_IN,
                                            out_specs=MOE_OUT)(params, x)
    run = {into: jax.jit(jax.shard_map(functools.partial(combine, into_residual=into),
                                       mesh=MOE_MESH, in_specs=MOE_IN, out_specs=MOE_OUT))(
               params, x) for into in (True, False)}
    np.testing.assert_allclose(run[False], moe_reference(params, x), rtol=2e-5, atol=2e-5)
    assert not np.allclose(run[True], moe_reference(params, x), atol=1e-3)


@pytest.mark.parametrize("barrier", [False, True], ids=["plain", "optimization_barrier"])
def test_gathered_tokens_times_this_devices_expert_weight_are_contributions(barrier):
    """`hs @ w[0]` (the group's gathered tokens times this device's expert weight: `w` one
    expert per device, its expert dim squeezed away) is per-device contributions, also behind
    `jax.lax.optimization_barrier` (the FSDP habit): the gathered tokens added to them before
    the psum_scatter are SPMD210 at the add; added after, accepted; the bug's numbers are
    wrong."""
    mesh = jax.make_mesh((2, 4), ("fsdp", "expert"), axis_types=(AxisType.Explicit,) * 2)
    w = jax.random.normal(jax.random.key(0), (4, 8, 8)) / 3
    h = jax.random.normal(jax.random.key(1), (16, 8))

    def combine(w, h, residual_first):
        hs = jax.lax.all_gather(h, "expert", tiled=True)
        w = jax.lax.optimization_barrier(w) if barrier else w
        if residual_first:
            return jax.lax.psum_scatter(hs + hs @ w[0], "expert", tiled=True)  # BUG SPMD210
        return jax.lax.psum_scatter(hs @ w[0], "expert", tiled=True) + h

    line = combine.__code__.co_firstlineno + 4
    specs = dict(mesh=mesh, in_specs=(P("expert"), P("expert")), out_specs=P("expert"))
    run = {}
    for first, codes in ((True, ["SPMD210"]), (False, [])):
        fn = functools.partial(combine, residual_first=first)
        rep = st.adapters.infer(fn, w, h, **specs)
        assert [(v.code, v.line) for v in rep.violations] == [(c, line) for c in codes]
        placed = [jax.device_put(a, jax.sharding.NamedSharding(mesh, P("expert"))) for a in (w, h)]
        run[first] = jax.jit(jax.shard_map(fn, **specs))(*placed)
    ref = h + sum(h @ w[e] for e in range(4))   # one device: each token through every expert
    np.testing.assert_allclose(run[False], ref, rtol=2e-5, atol=2e-5)
    assert not np.allclose(run[True], ref, atol=1e-3)


def test_a_stack_summed_is_not_a_slice():
    """What the out_spec does not tell: a psum of an in_spec Shard returned as is (n tiled
    copies, JAX's own test_psum_with_implicit_fanout_self_transposes), or combined only with
    its own operand (`x - pmean(x)`: a stack's mean per position), or a psum_scatter (its
    result is sharded over the axis anyway, JAX's test_matmul_reduce_scatter) is accepted."""
    x = jnp.arange(64.0).reshape(8, 8)
    spec = P(None, "tp")
    for body in (lambda x: jax.lax.psum(x, "tp"), lambda x: x - jax.lax.pmean(x, "tp"),
                 lambda x: jax.lax.psum_scatter(x, "tp", scatter_dimension=0, tiled=True)):
        rep = st.adapters.infer(body, x, mesh=MESH, in_specs=spec, out_specs=spec)
        assert rep.ok, [str(v) for v in rep.violations]
