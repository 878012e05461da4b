"""The Shard / Partial / Rep refinement rules as pure functions (no JAX): each rule of issue 15's
list on small shapes, with the error code where the refinement rejects."""

import types

import pytest

from spmdtyped import SpmdTypeError
from spmdtyped._rules import LITERAL, SpmdType
from spmdtyped._rules import refine as _refine
from spmdtyped._rules.axis_size import AxisSize, share_of
from spmdtyped._rules.refine import shape as _refine_shape

#: both rule modules as one namespace
rf = types.SimpleNamespace(**{**vars(_refine), **vars(_refine_shape)})

TP = SpmdType(varying="tp")
DP_TP = SpmdType(varying=("dp", "tp"))
INV = SpmdType()


def ref(**kinds):
    return rf.Refinement.of(kinds)


def arg(t, shape, **kinds):
    return rf.Arg(t, ref(**kinds), shape)


SHARD_LAST = rf.Shard(-1)
SHARD_ROWS = rf.Shard(-2)


def test_contracting_a_dim_sharded_on_both_sides_gives_partial():
    h = arg(TP, (4, 8), tp=SHARD_LAST)      # h: [b, f/tp]
    w2 = arg(TP, (8, 16), tp=SHARD_ROWS)    # w2: [f/tp, d]
    out = rf.einsum(rf.matmul_spec(2, 2), [h, w2], TP, op="@")
    assert out.get("tp") is rf.PARTIAL


def test_column_parallel_matmul_keeps_the_shard_on_the_output():
    x = arg(TP, (4, 16), tp=rf.REP)         # x replicated (pvary'd)
    w1 = arg(TP, (16, 8), tp=SHARD_LAST)    # w1: [d, f/tp]
    out = rf.einsum(rf.matmul_spec(2, 2), [x, w1], TP, op="@")
    assert out.get("tp") == SHARD_LAST
    x_inv = rf.Arg(INV, rf.NONE, (4, 16))
    assert rf.einsum(rf.matmul_spec(2, 2), [x_inv, w1], TP, op="@").get("tp") == SHARD_LAST


def test_contraction_of_a_shard_against_a_full_dim_is_plain():
    h = arg(TP, (4, 8), tp=SHARD_LAST)
    w = rf.Arg(INV, rf.NONE, (8, 16))
    assert rf.einsum(rf.matmul_spec(2, 2), [h, w], TP, op="@").get("tp") is None


def test_einsum_with_batch_dims():
    q = arg(TP, (2, 4, 8, 16), tp=rf.Shard(-2))   # heads sharded: b s h/tp d
    k = arg(TP, (2, 4, 8, 16), tp=rf.Shard(-2))
    out = rf.einsum("bqhd,bkhd->bhqk", [q, k], TP, op="einsum")
    assert out.get("tp") == rf.Shard(-3)
    s = arg(TP, (2, 8, 4, 4), tp=rf.Shard(-3))
    v = arg(TP, (2, 4, 8, 16), tp=rf.Shard(-2))
    assert rf.einsum("bhqk,bkhd->bqhd", [s, v], TP, op="einsum").get("tp") == rf.Shard(-2)
    o = arg(TP, (2, 4, 8, 16), tp=rf.Shard(-2))
    wo = arg(TP, (8, 16, 32), tp=rf.Shard(-3))
    assert rf.einsum("bqhd,hde->bqe", [o, wo], TP, op="einsum").get("tp") is rf.PARTIAL


def test_partial_plus_replicated_is_the_row_parallel_bias_bug():
    y = arg(TP, (4, 16), tp=rf.PARTIAL)
    b = rf.Arg(INV, rf.NONE, (16,))
    with pytest.raises(SpmdTypeError) as e:
        rf.elementwise("add", [y, b], TP, op="operator +")
    assert e.value.code == "SPMD210"
    with pytest.raises(SpmdTypeError):
        rf.elementwise("add", [y, arg(TP, (16,), tp=rf.REP)], TP, op="operator +")
    with pytest.raises(SpmdTypeError):
        rf.elementwise("add", [y, rf.Arg(LITERAL)], TP, op="operator +")


def test_partial_linear_combinations_stay_partial():
    p = arg(TP, (4,), tp=rf.PARTIAL)
    assert rf.elementwise("add", [p, p], TP, op="+").get("tp") is rf.PARTIAL
    assert rf.elementwise("mul", [p, rf.Arg(LITERAL)], TP, op="*").get("tp") is rf.PARTIAL
    assert rf.elementwise("mul", [p, rf.Arg(INV, rf.NONE, (4,))], TP, op="*").get("tp") is rf.PARTIAL
    assert rf.elementwise("div", [p, rf.Arg(LITERAL)], TP, op="/").get("tp") is rf.PARTIAL
    assert rf.elementwise("neg", [p], TP, op="-").get("tp") is rf.PARTIAL
    # Partial +- plain: nothing can be followed, no error
    assert rf.elementwise("add", [p, rf.Arg(TP, rf.NONE, (4,))], TP, op="+").get("tp") is None


def test_partial_divisor_and_nonlinear_ops_are_errors():
    p = arg(TP, (4,), tp=rf.PARTIAL)
    x = arg(TP, (4,), tp=SHARD_LAST)
    with pytest.raises(SpmdTypeError) as e:
        rf.elementwise("div", [x, p], TP, op="operator /")
    assert e.value.code == "SPMD212"
    for name in ("exp", "tanh", "maximum"):
        args = [p] if name != "maximum" else [p, rf.Arg(LITERAL)]
        with pytest.raises(SpmdTypeError) as e:
            rf.elementwise(name, args, TP, op=name)
        assert e.value.code == "SPMD211"
    with pytest.raises(SpmdTypeError):
        rf.elementwise("mul", [p, p], TP, op="*")


def test_where_on_a_partial_depends_on_the_predicate():
    p = arg(TP, (4,), tp=rf.PARTIAL)
    uniform = rf.Arg(INV, rf.NONE, (4,))
    varying = arg(TP, (4,), tp=SHARD_LAST)
    assert rf.elementwise("where", [uniform, p, p], TP, op="where").get("tp") is rf.PARTIAL
    with pytest.raises(SpmdTypeError) as e:
        rf.elementwise("where", [varying, p, p], TP, op="where")
    assert e.value.code == "SPMD213"


def test_owner_mask_makes_a_partial():
    idx = rf.axis_index(["tp"])
    assert idx.get("tp") is rf.INDEX
    pred = rf.elementwise("eq", [rf.Arg(TP, idx, ()), rf.Arg(LITERAL)], TP, op="==")
    assert pred.get("tp") is rf.ONEHOT
    x = rf.Arg(INV, rf.NONE, (4,))
    out = rf.elementwise("where", [rf.Arg(TP, pred, ()), x, rf.Arg(LITERAL)], TP, op="where",
                         onehot_fill=True)
    assert out.get("tp") is rf.PARTIAL


def test_shards_combine_only_when_aligned():
    a = arg(TP, (4, 8), tp=SHARD_LAST)
    b = arg(TP, (4, 8), tp=SHARD_ROWS)
    assert rf.elementwise("add", [a, a], TP, op="+").get("tp") == SHARD_LAST
    assert rf.elementwise("add", [a, b], TP, op="+").get("tp") is None
    # a bias vector on the last dim next to a row shard: fine, the shard is kept
    rows = arg(TP, (4, 8), tp=SHARD_ROWS)
    bias = rf.Arg(INV, rf.NONE, (8,))
    assert rf.elementwise("add", [rows, bias], TP, op="+").get("tp") == SHARD_ROWS
    # right-aligned: a rank-1 shard lines up with the last dim of a rank-2 shard
    v = arg(TP, (8,), tp=SHARD_LAST)
    assert rf.elementwise("mul", [a, v], TP, op="*").get("tp") == SHARD_LAST


def test_sum_and_mean_over_a_shard_dim_are_partial_other_reductions_plain():
    x = arg(TP, (4, 8), tp=SHARD_LAST)
    assert rf.reduction("sum", TP, x.ref, TP, ndim=2, axis=-1, op=".sum()").get("tp") is rf.PARTIAL
    assert rf.reduction("sum", TP, x.ref, TP, ndim=2, axis=None, op=".sum()").get("tp") is rf.PARTIAL
    assert rf.reduction("sum", TP, x.ref, TP, ndim=2, axis=0, op=".sum()").get("tp") == SHARD_LAST
    rows = ref(tp=SHARD_ROWS)
    assert rf.reduction("sum", TP, rows, TP, ndim=2, axis=1, op=".sum()").get("tp") == SHARD_LAST
    assert rf.reduction("sum", TP, rows, TP, ndim=2, axis=1, keepdims=True, op=".sum()").get("tp") \
        == SHARD_ROWS
    for name in ("max", "min", "argmax", "var", "std", "prod"):
        assert rf.reduction(name, TP, x.ref, TP, ndim=2, axis=-1, op=name).get("tp") is None
    # a mean is a sum divided by the local count (a literal): Megatron's psum(mean) / n is
    # correct, and x - mean(x) over a sharded hidden dim is the layernorm bug (class 13)
    assert rf.reduction("mean", TP, x.ref, TP, ndim=2, axis=-1, op="mean").get("tp") is rf.PARTIAL
    for name in ("cumsum", "sort", "flip", "roll", "take"):
        assert rf.along_dim(name, TP, x.ref, TP, ndim=2, axis=-1, op=name).get("tp") is None
        assert rf.along_dim(name, TP, x.ref, TP, ndim=2, axis=0, op=name).get("tp") == SHARD_LAST


def test_max_of_a_partial_is_an_error():
    with pytest.raises(SpmdTypeError) as e:
        rf.reduction("max", TP, ref(tp=rf.PARTIAL), TP, ndim=1, axis=None, op="max")
    assert e.value.code == "SPMD211"


def test_reshape_keeps_the_outermost_factor_of_a_split_and_a_merge_only_when_outermost():
    heads = ref(tp=SHARD_LAST)   # [b, h*d/tp]
    out = rf.reshape(TP, heads, (4, 32), (4, 2, 16))
    assert out.get("tp") == rf.Shard(-2)          # the heads dim (outermost factor)
    merged = rf.reshape(TP, ref(tp=rf.Shard(-2)), (4, 2, 16), (4, 32))
    assert merged.get("tp") == SHARD_LAST
    inner = rf.reshape(TP, ref(tp=SHARD_LAST), (4, 2, 16), (4, 32))
    assert inner.get("tp") is None                # the sharded dim is not outermost


def test_constant_index_into_a_sharded_dim_drops_it():
    x = ref(tp=SHARD_ROWS)
    assert rf.index(TP, x, TP, 2, ["int"], 1).get("tp") is None
    assert rf.index(TP, x, TP, 2, ["slice:full", "int"], 1).get("tp") == SHARD_LAST
    assert rf.index(TP, x, TP, 2, ["none", "ellipsis"], 3).get("tp") == SHARD_ROWS


def test_collectives():
    p = ref(tp=rf.PARTIAL)
    assert rf.collective("psum", TP, p, INV, ["tp"], shape=(4,), op="psum").items == ()
    scat = rf.collective("psum_scatter", TP, p, TP, ["tp"], shape=(8, 4), op="psum_scatter",
                         params={"scatter_dimension": 0, "tiled": True})
    assert scat.get("tp") == SHARD_ROWS
    for name in ("ppermute", "all_to_all"):
        assert rf.collective(name, TP, p, TP, ["tp"], shape=(4,), op=name).get("tp") is None
    shard = ref(tp=SHARD_ROWS)
    g = rf.collective("all_gather", TP, shard, TP, ["tp"], shape=(2, 4), op="all_gather",
                      params={"axis": 0, "tiled": True})
    assert g.get("tp") is rf.REP
    assert rf.collective("ppermute", TP, shard, TP, ["tp"], shape=(2, 4), op="ppermute").get("tp") \
        is None
    a2a = rf.collective("all_to_all", TP, shard, TP, ["tp"], shape=(8, 4), op="all_to_all",
                        params={"split_axis": 1, "concat_axis": 0, "tiled": True})
    assert a2a.get("tp") == SHARD_LAST
    assert rf.collective("pvary", INV, rf.NONE, TP, ["tp"], op="pvary").get("tp") is rf.REP


def grad_ref(**kinds):
    return ref(**kinds).with_grad(True)


def test_psum_of_a_shard_gradient_over_its_own_axis_is_an_error():
    with pytest.raises(SpmdTypeError) as e:
        rf.collective("psum", TP, grad_ref(tp=SHARD_ROWS), INV, ["tp"], shape=(2, 4),
                      op="st.psum")
    assert e.value.code == "SPMD108"
    # one expert per device (local extent 1) is still a shard: expert gradients summed over
    # the expert axis are the bug (tests/bugs/expert_grads_wrong_group.py)
    with pytest.raises(SpmdTypeError):
        rf.collective("psum", TP, grad_ref(tp=SHARD_ROWS), INV, ["tp"], shape=(1, 4), op="pmean")


def test_psum_of_a_shard_that_is_not_a_gradient_is_accepted():
    # a value sharded by its in_spec may be a stack of per-device terms (F5): its psum is right
    assert rf.collective("psum", TP, ref(tp=SHARD_ROWS), INV, ["tp"], shape=(2, 4),
                         op="st.psum").items == ()


def test_the_gradient_flag_flows_through_cotangents_and_collectives():
    ct = rf.cotangent(ref(dp=rf.REP, ep=SHARD_ROWS))
    assert ct.grad and ct.get("dp") is rf.PARTIAL and ct.get("ep") == SHARD_ROWS
    t = SpmdType(varying=("dp", "ep"))
    after = rf.collective("psum", t, ct, SpmdType(varying="ep"), ["dp"], shape=(1, 4, 3),
                          op="psum")
    assert after.grad and after.get("ep") == SHARD_ROWS
    with pytest.raises(SpmdTypeError) as e:
        rf.collective("psum", t, ct, INV, ["dp", "ep"], shape=(1, 4, 3), op="psum")
    assert e.value.code == "SPMD108" and e.value.axes == ("ep",)


def test_a_replicated_term_divided_by_the_axis_size_is_a_partial_term():
    y = arg(TP, (4, 16), tp=rf.PARTIAL)
    share = rf.Arg(INV, rf.with_share(rf.DATA, INV, ("tp",)), (16,))
    assert rf.elementwise("add", [y, share], TP, op="+").get("tp") is rf.PARTIAL
    assert rf.elementwise("sub", [share, y], TP, op="-").get("tp") is rf.PARTIAL
    # the same term without the division, or divided by another axis's size: SPMD210
    for b in (rf.Arg(INV, rf.DATA, (16,)),
              rf.Arg(INV, rf.with_share(rf.DATA, INV, ("dp",)), (16,))):
        with pytest.raises(SpmdTypeError) as e:
            rf.elementwise("add", [y, b], TP, op="+")
        assert e.value.code == "SPMD210"
    # divided by the size of dp and tp together: a Partial over both only
    both = rf.Arg(INV, rf.with_share(rf.DATA, INV, ("dp", "tp")), (16,))
    with pytest.raises(SpmdTypeError):
        rf.elementwise("add", [y, both], TP, op="+")
    y2 = arg(DP_TP, (4, 16), dp=rf.PARTIAL, tp=rf.PARTIAL)
    out = rf.elementwise("add", [y2, both], DP_TP, op="+")
    assert out.get("dp") is rf.PARTIAL and out.get("tp") is rf.PARTIAL
    # a share is made only of a value equal on every device of the axis
    assert rf.with_share(ref(tp=SHARD_LAST), TP, ("tp",)).share == ()
    # the share is not kept by another op: (b / n) * 2 is a replicated term again
    doubled = rf.elementwise("mul", [share, rf.Arg(LITERAL)], INV, op="*")
    assert doubled.share == ()


def test_axis_size_remembers_its_axes():
    n = AxisSize(4, ("tp",))
    assert n == 4 and n * 2 == 8 and type(n * 2) is int
    assert share_of("div", [1.0, n]) == (0, ("tp",))
    inv = 1 / n
    assert inv == 0.25 and share_of("mul", [inv, 3.0]) == (1, ("tp",))
    assert share_of("mul", [3.0, inv]) == (0, ("tp",))
    assert type(2 / n) is float and share_of("mul", [3.0, 2 / n]) is None
    assert share_of("div", [1.0, 4]) is None           # a literal is not an axis size


def test_cotangents_swap_rep_and_partial():
    r = ref(dp=rf.REP, tp=rf.PARTIAL)
    ct = rf.cotangent(r)
    assert ct.get("dp") is rf.PARTIAL and ct.get("tp") is rf.REP
    assert rf.cotangent(ref(tp=SHARD_ROWS)).get("tp") == SHARD_ROWS


def test_from_spec():
    r = rf.from_spec(("dp", None, "tp"), 3, {"dp", "tp"})
    assert r.get("dp") == rf.Shard(-3) and r.get("tp") == SHARD_LAST
    two = rf.from_spec(("tp", "tp"), 2, {"tp"})
    assert two.get("tp") is None
    both = rf.from_spec((("dp", "tp"), None), 2, {"dp", "tp"})
    assert both.get("dp") == SHARD_ROWS and both.get("tp") == SHARD_ROWS
    # the rank unknown (the static checker, a hint without dims): dims stay counted from the
    # left, as a `Shard["dp", 0]` hint, and `accepts` resolves them once the rank is known
    left = rf.from_spec(("dp", None, "tp"), None, {"dp", "tp"})
    assert left.get("dp") == rf.Shard(0) and left.get("tp") == rf.Shard(2)
    assert rf.accepts(left, ref(dp=rf.Shard(-3)), DP_TP, ndim=3) is None
    assert rf.accepts(left, ref(dp=SHARD_ROWS), DP_TP, ndim=3) is not None


def test_check_return():
    """The return rule (SPMD401): Varying covariant, Unreduced / Reduced exact, a refinement
    reason reported when the states fit."""
    from spmdtyped._rules import check_return

    check_return(INV, TP, where="f")                       # Invariant fits Varying
    check_return(TP, TP, where="f")
    for have, want, fix in ((TP, INV, "st.psum(y, 'tp')"), (SpmdType(unreduced="tp"), INV, "st.psum"),
                            (SpmdType(unreduced="tp"), TP, "st.psum"), (SpmdType(reduced="tp"), INV, "pcast"),
                            (DP_TP, SpmdType(varying="dp"), "st.psum(y, 'tp')")):
        with pytest.raises(SpmdTypeError) as e:
            check_return(have, want, where="f")
        assert e.value.code == "SPMD401" and fix in (e.value.fix or ""), (have, want)
    with pytest.raises(SpmdTypeError, match="Partial over 'tp'"):
        check_return(TP, TP, where="f", refinement="this value is Partial over 'tp', but the hint wants Rep")


def test_gradual_hints():
    want = rf.hint_refinement({"tp": -1}, ())
    assert rf.accepts(want, rf.NONE, TP) is None                  # plain Varying: accepted
    assert rf.accepts(want, ref(tp=SHARD_LAST), TP) is None
    assert rf.accepts(want, ref(tp=rf.PARTIAL), TP) is not None   # another kind: refused
    assert rf.accepts(want, rf.NONE, INV) is not None             # Invariant: refused


def test_shard_minus_partial_is_an_error():
    x = arg(TP, (4, 8), tp=SHARD_LAST)
    mean = arg(TP, (4, 1), tp=rf.PARTIAL)
    with pytest.raises(SpmdTypeError) as e:
        rf.elementwise("sub", [x, mean], TP, op="operator -")
    assert e.value.code == "SPMD210"


def test_shard_with_a_per_device_value_of_extent_one_keeps_the_shard():
    logits = arg(TP, (4, 8), tp=SHARD_LAST)
    local_max = arg(TP, (4, 1))                        # plain Varying, extent 1 on the shard dim
    assert rf.elementwise("sub", [logits, local_max], TP, op="-").get("tp") == SHARD_LAST
    full = arg(TP, (4, 8))                             # plain Varying along the shard: plain
    assert rf.elementwise("sub", [logits, full], TP, op="-").get("tp") is None


def test_replicated_data_along_a_shard_dim_is_an_error_but_constants_are_not():
    heads = arg(TP, (2, 4, 8), tp=rf.Shard(-2))
    sinks = rf.Arg(INV, rf.DATA, (4, 1))              # a parameter, sliced to the local heads
    with pytest.raises(SpmdTypeError) as e:
        rf.elementwise("add", [heads, sinks], TP, op="operator +")
    assert e.value.code == "SPMD215"
    zeros = rf.Arg(INV, rf.NONE, (2, 4, 8))           # a constant (jnp.zeros): fine
    assert rf.elementwise("add", [heads, zeros], TP, op="+").get("tp") == rf.Shard(-2)
    bias = rf.Arg(INV, rf.DATA, (8,))                  # along an unsharded dim: fine
    assert rf.elementwise("add", [heads, bias], TP, op="+").get("tp") == rf.Shard(-2)


def test_allowed_codes_fall_back_to_plain():
    import spmdtyped as st

    y = arg(TP, (4, 16), tp=rf.PARTIAL)
    b = rf.Arg(INV, rf.DATA, (16,))
    with st.allow("SPMD210"):
        assert rf.elementwise("add", [y, b], TP, op="+").get("tp") is None
    with st.allow("SPMD108"):
        assert rf.collective("psum", TP, grad_ref(tp=SHARD_ROWS), INV, ["tp"], shape=(2, 4),
                             op="psum").items == ()


def test_data_flag_propagates():
    x = rf.Arg(TP, rf.Refinement.of({"tp": SHARD_LAST}, data=True), (4, 8))
    c = rf.Arg(LITERAL)
    assert rf.elementwise("mul", [x, c], TP, op="*").data
    assert rf.reduction("sum", TP, x.ref, TP, ndim=2, axis=0, op="sum").data
    assert not rf.elementwise("mul", [rf.Arg(TP, rf.NONE, (4,)), c], TP, op="*").data
    assert rf.from_spec(("tp",), 1, {"tp"}).data


def test_dot_spec_contracts_last_against_second_to_last():
    assert rf.dot_spec(2, 2) == rf.matmul_spec(2, 2)
    assert rf.dot_spec(3, 2) == "abz,zy->aby"
    assert rf.dot_spec(2, 3) == "az,izy->aiy"
    assert rf.dot_spec(0, 2) == ""
    h = arg(TP, (2, 4, 8), tp=SHARD_LAST)
    w = arg(TP, (8, 16), tp=SHARD_ROWS)
    assert rf.einsum(rf.dot_spec(3, 2), [h, w], TP, op="dot").get("tp") is rf.PARTIAL


def test_softmax_over_a_shard_dim_is_an_error_elsewhere_kept():
    x = ref(tp=SHARD_LAST)
    for name in ("softmax", "log_softmax", "logsumexp"):
        with pytest.raises(SpmdTypeError) as e:
            rf.softmax(name, TP, x, TP, ndim=2, axis=-1, op=f"st.nn.{name}")
        assert e.value.code == "SPMD211" and "normalises" in str(e.value)
    assert rf.softmax("softmax", TP, ref(tp=SHARD_ROWS), TP, ndim=2, axis=-1, op="s").get("tp") \
        == SHARD_ROWS
    # logsumexp drops the reduced dim: the rows' shard becomes the last dim
    assert rf.softmax("logsumexp", TP, ref(tp=SHARD_ROWS), TP, ndim=2, axis=-1, op="l").get("tp") \
        == SHARD_LAST
    with pytest.raises(SpmdTypeError) as e:
        rf.softmax("softmax", TP, ref(tp=rf.PARTIAL), TP, ndim=2, axis=-1, op="s")
    assert e.value.code == "SPMD211"
    assert rf.softmax("softmax", TP, ref(tp=rf.REP), TP, ndim=2, axis=-1, op="s").get("tp") is rf.REP


def test_take_along_other_dims_keeps_the_shard():
    x = ref(tp=SHARD_LAST)
    assert rf.take(TP, x, TP, ndim=2, axis=0, index_ndim=1).get("tp") == SHARD_LAST
    assert rf.take(TP, x, TP, ndim=2, axis=-1, index_ndim=1).get("tp") is None
    assert rf.take(TP, x, TP, ndim=2, axis=None, index_ndim=1).get("tp") is None
    rows = ref(tp=SHARD_ROWS)   # a scalar index on the last dim: the rows become the last dim
    assert rf.take(TP, rows, TP, ndim=2, axis=1, index_ndim=0).get("tp") == SHARD_LAST
    assert rf.take(TP, rows, TP, ndim=2, axis=1, index_ndim=2).get("tp") == rf.Shard(-3)
    # an index that varies over the axis: each device picks other elements
    assert rf.take(TP, ref(tp=rf.REP), TP, ndim=2, axis=0, index_ndim=1,
                   index_varying={"tp"}).get("tp") is None


def test_traced_index_keeps_rep_only_where_the_index_is_uniform():
    r = ref(tp=rf.REP)
    assert rf.index(TP, r, TP, 2, ["array"], 2).get("tp") is rf.REP
    assert rf.index(TP, r, TP, 2, ["array"], 2, index_varying={"tp"}).get("tp") is None


def test_broadcast_keeps_a_shard_whose_extent_is_unchanged():
    x = ref(tp=SHARD_LAST)
    assert rf.broadcast(TP, x, (4, 8), (3, 4, 8)).get("tp") == SHARD_LAST
    assert rf.broadcast(TP, x, (4, 8), (4, 16)).get("tp") is None          # tiled along it
    assert rf.broadcast(TP, ref(tp=rf.Shard(-1)), (4, 1), (4, 8)).get("tp") is None
    assert rf.broadcast(TP, ref(tp=rf.PARTIAL), (4,), (2, 4)).get("tp") is rf.PARTIAL


def test_at_update():
    p = arg(TP, (4,), tp=rf.PARTIAL)
    assert rf.at_update("set", p, rf.Arg(LITERAL, rf.NONE, ()), TP).get("tp") is rf.PARTIAL
    assert rf.at_update("add", p, p, TP).get("tp") is rf.PARTIAL
    assert rf.at_update("add", p, rf.Arg(INV, rf.NONE, ()), TP).get("tp") is None
    s = arg(TP, (4,), tp=SHARD_LAST)
    assert rf.at_update("set", s, rf.Arg(LITERAL, rf.NONE, ()), TP).get("tp") == SHARD_LAST
    assert rf.at_update("set", s, rf.Arg(INV, rf.NONE, ()), TP).get("tp") is None


def test_one_hot_appends_a_dim_and_rejects_a_partial():
    assert rf.one_hot(TP, ref(tp=SHARD_LAST), TP, op="one_hot").get("tp") == rf.Shard(-2)
    with pytest.raises(SpmdTypeError) as e:
        rf.one_hot(TP, ref(tp=rf.PARTIAL), TP, op="one_hot")
    assert e.value.code == "SPMD211"


def test_squeeze_drops_a_size_one_dim():
    assert rf.squeeze(TP, ref(tp=SHARD_ROWS), 3, [-1]).get("tp") == SHARD_LAST


def test_all_to_all_with_split_equal_to_concat_is_plain():
    x = ref(tp=SHARD_LAST)
    params = {"split_axis": 0, "concat_axis": 0, "tiled": True}
    assert rf.collective("all_to_all", TP, x, TP, ("tp",), shape=(8, 4), op="a2a",
                         params=params).get("tp") is None
    params = {"split_axis": 0, "concat_axis": 1, "tiled": True}
    assert rf.collective("all_to_all", TP, x, TP, ("tp",), shape=(8, 4), op="a2a",
                         params=params).get("tp") == SHARD_ROWS


def test_hints_resolve_dims_from_the_left_against_the_rank():
    want = rf.hint_refinement({"tp": 1})
    assert rf.accepts(want, ref(tp=SHARD_LAST), TP, ndim=2) is None
    assert "wants Shard(-2)" in rf.accepts(want, ref(tp=SHARD_LAST), TP, ndim=3)
    assert rf.accepts(want, ref(tp=SHARD_LAST), TP) is None    # rank unknown: gradual
    assert "rank 1" in rf.accepts(want, rf.NONE, TP, ndim=1)
    rep = rf.hint_refinement({}, rep=("tp",))
    assert rf.accepts(rep, ref(tp=rf.REP), TP) is None
    assert "Partial" in rf.accepts(rep, ref(tp=rf.PARTIAL), TP)
