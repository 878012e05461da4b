"""The single-op lowering scan: every op of the surface table x {Reduced, Unreduced, Varying,
Invariant} over 'tp' is rejected with a code, or is jitted, lowered, compiled and RUN on the
8-device mesh, its result compared with a single-device reference (numbers, not only types).

Each case builds a value of the state on ('dp', 'tp') = (2, 4) whose true value is known:

- Invariant and Reduced: `X` itself;
- Varying: `X * (k + 1)` on tp-device k (each device its own value);
- Unreduced: partials `X * (k + 1) / 10` (they sum to `X`).

The op runs on it; the result is brought to Varying over tp without changing its value (psum
an Unreduced result, cast a Reduced one, pvary an Invariant one) and leaves through `P("tp")`
stacked per device. Block k must equal the reference op on device k's true value (for
collectives: the raw `jax.lax` twin of the same program). Accepted cases are compiled in
batches (one program per batch; a failing batch is split to name the op), so the scan stays
within about a minute per JAX version. Nothing is sampled: every row runs in every state.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import _surface

STATES = ("reduced", "unreduced", "varying", "invariant")
X = (jnp.arange(24.0).reshape(4, 6) - 9.5) / 7.0
N_TP = 4

# ------------------------------------------------------------------------------ op recipes
# Each recipe takes the namespace (`st.numpy`/`jnp`, `st.nn`/`jax.nn`, or None for forms
# that work on typed and raw arrays alike) and the operand, and returns the op's result.

Recipe = Callable[..., Any]

_NUMPY_ARGS: dict[str, Recipe] = {
    "reshape": lambda m, x: m.reshape(x, (-1,)),
    "swapaxes": lambda m, x: m.swapaxes(x, 0, 1),
    "moveaxis": lambda m, x: m.moveaxis(x, 0, 1),
    "expand_dims": lambda m, x: m.expand_dims(x, 0),
    "squeeze": lambda m, x: m.squeeze(m.expand_dims(x, 0), 0),
    "broadcast_to": lambda m, x: m.broadcast_to(x, (2, 4, 6)),
    "roll": lambda m, x: m.roll(x, 1, axis=1),
    "tile": lambda m, x: m.tile(x, 2),
    "repeat": lambda m, x: m.repeat(x, 2, axis=0),
    "pad": lambda m, x: m.pad(x, 1),
    "take": lambda m, x: m.take(x, jnp.array([0, 2]), axis=0),
    "concatenate": lambda m, x: m.concatenate([x, x], axis=0),
    "stack": lambda m, x: m.stack([x, x]),
    "einsum": lambda m, x: m.einsum("ij,kj->ik", x, x),
    "dot": lambda m, x: m.dot(x, m.transpose(x)),
    "matmul": lambda m, x: m.matmul(x, m.transpose(x)),
    "where": lambda m, x: m.where(x > 0.0, x, x),
    "full_like": lambda m, x: m.full_like(x, 2.0),
    "zeros": lambda m, x: m.zeros((2, 3)) + 0.0 * x[0, :3],
    "ones": lambda m, x: m.ones((2, 3)) + 0.0 * x[0, :3],
    "empty": lambda m, x: m.zeros((2, 3)) + 0.0 * x[0, :3],
    "full": lambda m, x: m.full((2, 3), 1.5) + 0.0 * x[0, :3],
    "arange": lambda m, x: m.arange(3.0) + 0.0 * x[0, :3],
    "linspace": lambda m, x: m.linspace(0.0, 1.0, 3) + 0.0 * x[0, :3],
    "eye": lambda m, x: m.eye(3) + 0.0 * x[:3, :3],
    "cumsum": lambda m, x: m.cumsum(x, axis=0),
    "cumprod": lambda m, x: m.cumprod(x, axis=0),
    "argmax": lambda m, x: m.argmax(x, axis=0),
    "argmin": lambda m, x: m.argmin(x, axis=0),
    "sort": lambda m, x: m.sort(x, axis=0),
    "flip": lambda m, x: m.flip(x, axis=0),
    "logical_not": lambda m, x: m.logical_not(x > 0.0),
    "logical_and": lambda m, x: m.logical_and(x > 0.0, x < 1.0),
    "logical_or": lambda m, x: m.logical_or(x > 0.0, x < -1.0),
    "logical_xor": lambda m, x: m.logical_xor(x > 0.0, x < 1.0),
    "split": lambda m, x: m.split(x, 2, axis=1)[0],
    "take_along_axis": lambda m, x: m.take_along_axis(x, jnp.zeros(x.shape, jnp.int32), axis=1),
    "dynamic_slice_in_dim": lambda m, x: m.dynamic_slice_in_dim(x, 1, 2, axis=1),
}
_NN_ARGS: dict[str, Recipe] = {
    "one_hot": lambda m, x: m.one_hot(x[0], 4),
}


def _numpy_recipe(name: str, binding: str) -> Recipe:
    if name in _NUMPY_ARGS:
        return _NUMPY_ARGS[name]
    if binding == "binary":
        return lambda m, x: getattr(m, name)(x, x)
    return lambda m, x: getattr(m, name)(x)


def _cases() -> list[tuple[str, str, Recipe, Recipe]]:
    """(case id, kind, typed recipe, reference recipe) for every surface row."""
    out: list[tuple[str, str, Recipe, Recipe]] = []
    for r in _surface.NUMPY:
        rec = _numpy_recipe(r.name, r.binding)
        ref = jax.lax if r.jax.startswith("jax.lax.") else jnp  # jax.numpy has no rsqrt
        out.append((f"numpy.{r.name}", "op", lambda x, rec=rec: rec(st.numpy, x),
                    lambda x, rec=rec, ref=ref: rec(ref, x)))
    for r in _surface.NN:
        rec = _NN_ARGS.get(r.name, lambda m, x, n=r.name: getattr(m, n)(x))
        out.append((f"nn.{r.name}", "op", lambda x, rec=rec: rec(st.nn, x),
                    lambda x, rec=rec: rec(jax.nn, x)))
    method_args = {"reshape": (-1,), "astype": (jnp.float16,), "squeeze": ()}
    for r in _surface.METHODS:
        if r.name == "squeeze":
            def rec(x: Any) -> Any:
                return x.reshape(1, 4, 6).squeeze(0)
        else:
            def rec(x: Any, n: str = r.name, a: tuple[Any, ...] = method_args.get(r.name, ())) -> Any:
                return getattr(x, n)(*a)
        out.append((f"x.{r.name}()", "op", rec, rec))
    for r in _surface.PROPERTIES:
        if r.rule is not None:
            out.append((f"x.{r.name}", "op", lambda x, n=r.name: getattr(x, n),
                        lambda x, n=r.name: getattr(x, n)))
    for r in _surface.OPERATORS:
        fn = {"and": lambda a, b: (a > 0.0) & (b < 1.0), "or": lambda a, b: (a > 0.0) | (b < 1.0),
              "xor": lambda a, b: (a > 0.0) ^ (b < 1.0)}.get(r.rule or "")
        if fn is None:
            import operator
            fn = getattr(operator, r.jax.removeprefix("operator."))
        if r.rule == "matmul":
            out.append(("x @ x.T", "op", lambda x: x @ x.T, lambda x: x @ x.T))
            continue
        out.append((f"x {r.symbol} x", "op", lambda x, f=fn: f(x, x), lambda x, f=fn: f(x, x)))
        if r.rule not in ("and", "or", "xor"):
            out.append((f"x {r.symbol} 1.5", "op", lambda x, f=fn: f(x, 1.5),
                        lambda x, f=fn: f(x, 1.5)))
            out.append((f"1.5 {r.symbol} x", "op", lambda x, f=fn: f(1.5, x),
                        lambda x, f=fn: f(1.5, x)))
    for r in _surface.UNARY_OPERATORS:
        import operator as _op
        fn = {"-x": _op.neg, "+x": _op.pos, "~x": lambda a: ~(a > 0.0), "abs(x)": abs}[r.form]
        out.append((r.form, "op", fn, fn))
    out.append(("x[1]", "op", lambda x: x[1], lambda x: x[1]))
    out.append(("x[index array]", "op", lambda x: x[jnp.array([2, 0])],
                lambda x: x[jnp.array([2, 0])]))
    for r in _surface.AT:
        out.append((f"x.at[1].{r.name}(2.0)", "op", lambda x, n=r.name: getattr(x.at[1], n)(2.0),
                    lambda x, n=r.name: getattr(x.at[1], n)(2.0)))
    out.extend(_argument_cases())
    for c in _surface.COLLECTIVES:
        if not c.ops:
            continue
        out.append((f"st.{c.name}", "collective", _collective(c.name, typed=True),
                    _collective(c.name, typed=False)))
    return out


def _argument_cases() -> list[tuple[str, str, Recipe, Recipe]]:
    """Rows whose rule depends on keywords and dtypes, and secondary arguments that vary per
    device ("op_k": the reference takes the tp index k; the typed op reads st.axis_index)."""
    def k_() -> Any:
        return st.axis_index("tp")

    def kf() -> Any:
        return st.axis_index("tp").astype(jnp.float32)

    keyword_forms: dict[str, Recipe] = {
        "pad(constant_values=5.0)": lambda m, x: m.pad(x, 1, constant_values=5.0),
        "pad(mode='edge')": lambda m, x: m.pad(x, 1, mode="edge"),
        "pad(mode='reflect')": lambda m, x: m.pad(x, 1, "reflect"),
        "pad(mode='maximum')": lambda m, x: m.pad(x, 1, mode="maximum"),
        "pad(mode='mean')": lambda m, x: m.pad(x, 1, mode="mean"),
        "pad(mode='linear_ramp')": lambda m, x: m.pad(x, 1, mode="linear_ramp"),
        "sum(dtype=int32)": lambda m, x: m.sum(x, axis=0, dtype=jnp.int32),
        "sum(initial=1.0)": lambda m, x: m.sum(x, axis=0, initial=1.0),
        "sum(where=x > 0)": lambda m, x: m.sum(x, axis=0, where=x > 0.0),
    }
    out: list[tuple[str, str, Recipe, Recipe]] = [
        (f"numpy.{n}", "op", lambda x, r=r: r(st.numpy, x), lambda x, r=r: r(jnp, x))
        for n, r in keyword_forms.items()]
    out += [
        ("x.astype(int32)", "op", lambda x: x.astype(jnp.int32), lambda x: x.astype(jnp.int32)),
        ("x.astype(bool)", "op", lambda x: x.astype(jnp.bool_), lambda x: x.astype(jnp.bool_)),
        ("x.sum(dtype=int32)", "op", lambda x: x.sum(dtype=jnp.int32),
         lambda x: x.sum(dtype=jnp.int32)),
    ]
    out += [
        ("numpy.roll(shift=k)", "op_k", lambda x: st.numpy.roll(x, k_(), axis=0),
         lambda x, k: jnp.roll(x, k, axis=0)),
        ("numpy.pad(constant_values=k)", "op_k", lambda x: st.numpy.pad(x, 1, constant_values=kf()),
         lambda x, k: jnp.pad(x, 1, constant_values=float(k))),
        ("numpy.linspace(k, 5, 6)", "op_k", lambda x: st.numpy.linspace(kf(), 5.0, 6) + x[0],
         lambda x, k: jnp.linspace(float(k), 5.0, 6) + x[0]),
        ("x.at[k].set(2.0)", "op_k", lambda x: x.at[k_()].set(2.0),
         lambda x, k: x.at[k].set(2.0)),
        ("x.at[k].add(1.0)", "op_k", lambda x: x.at[k_()].add(1.0),
         lambda x, k: x.at[k].add(1.0)),
        ("x[k]", "op_k", lambda x: x[k_()], lambda x, k: x[k]),
        ("nn.softmax(where=x > k)", "op_k", lambda x: st.nn.softmax(x, where=x > kf()),
         lambda x, k: jax.nn.softmax(x, where=x > k)),
        ("nn.logsumexp(b=k + 1)", "op_k", lambda x: st.nn.logsumexp(x, axis=1, b=kf() + 1.0),
         lambda x, k: jax.nn.logsumexp(x, axis=1, b=k + 1.0)),
    ]
    return out


def _collective(name: str, *, typed: bool) -> Recipe:
    ns: Any = st if typed else lax
    perm = [(k, (k + 1) % N_TP) for k in range(N_TP)]
    calls: dict[str, Callable[[Any], Any]] = {
        "psum": lambda x: ns.psum(x, "tp"), "pmean": lambda x: ns.pmean(x, "tp"),
        "pmax": lambda x: ns.pmax(x, "tp"), "pmin": lambda x: ns.pmin(x, "tp"),
        "ppermute": lambda x: ns.ppermute(x, "tp", perm),
        "pshuffle": lambda x: ns.pshuffle(x, "tp", [1, 2, 3, 0]),
        # raw twin: the equivalent JAX documents (jax.lax.pbroadcast has no CPU lowering)
        "pbroadcast": (lambda x: st.pbroadcast(x, "tp", 0)) if typed else (
            lambda x: lax.psum(jnp.where(lax.axis_index("tp") == 0, x, jnp.zeros_like(x)), "tp")),
        "all_gather": lambda x: ns.all_gather(x, "tp", axis=0, tiled=True),
        "psum_scatter": lambda x: ns.psum_scatter(x, "tp", scatter_dimension=0, tiled=True),
        "all_to_all": lambda x: ns.all_to_all(x, "tp", 0, 0, tiled=True),
        "pcast": lambda x: ns.pcast(x, "tp", to="varying"),
        "pvary": (lambda x: st.pvary(x, "tp")) if typed else (lambda x: lax.pcast(x, "tp", to="varying")),
    }
    return calls[name]


# ------------------------------------------------------------------------------ one program


def _make(state: str, v: Any) -> Any:
    """A typed value in `state` over tp whose true value on tp-device k is `_true(state, k)`."""
    k = (st.axis_index("tp") + 1).astype(jnp.float32)
    if state == "invariant":
        return st.wrap(v)
    if state == "reduced":
        return st.pcast(v, "tp", to="reduced")
    if state == "varying":
        return st.pvary(v, "tp") * k
    return st.pcast(st.pvary(v, "tp") * (k / 10.0), "tp", to="unreduced")


def _true(state: str, k: int) -> Any:
    return X * (k + 1) if state == "varying" else X


def _to_varying(y: Any) -> Any:
    """`y` Varying over tp with the same value: psum an Unreduced result, cast a Reduced one,
    pvary an Invariant one; then a leading axis to stack the devices."""
    t = st.typeof(y)
    if "tp" in t.unreduced:
        y = st.psum(y, "tp")
        t = st.typeof(y)
    if "tp" in t.reduced:
        y = st.pcast(y, "tp", to="varying")
    elif "tp" not in t.varying:
        y = st.pvary(y, "tp")
    return st.numpy.expand_dims(y, 0)


def _raw_make(state: str, v: Any) -> Any:
    k = (lax.axis_index("tp") + 1).astype(jnp.float32)
    if state in ("invariant", "reduced"):
        return v if state == "invariant" else lax.pcast(v, "tp", to="reduced")
    vv = lax.pcast(v, "tp", to="varying") * k
    return vv if state == "varying" else lax.pcast(vv / 10.0, "tp", to="unreduced")


def _raw_to_varying(y: Any) -> Any:
    m = jax.typeof(y).manual_axis_type
    if "tp" in m.unreduced:
        y = lax.psum(y, "tp")
        m = jax.typeof(y).manual_axis_type
    if "tp" not in m.varying:
        y = lax.pcast(y, "tp", to="varying")
    return y[None]


Case = tuple[str, str, str, Recipe, Recipe]


def _trace(mesh: Any, case: Case) -> str | None:
    """None when spmdtyped accepts the case (its body traces), else the code it raised.
    Anything else (a raw exception, SPMD901) is a finding."""
    cid, kind, state, typed, _ref = case
    f = st.shard_map(lambda v: _to_varying(typed(_make(state, v))), mesh=mesh, in_specs=P(),
                     out_specs=P("tp"))
    try:
        jax.jit(f).trace(X)
    except st.SpmdTypeError as e:
        return e.code
    return None


def _run_batch(mesh: Any, batch: list[Case]) -> list[Any]:
    def body(v: Any) -> Any:
        return [_to_varying(typed(_make(state, v))) for _c, _k, state, typed, _r in batch]

    f = st.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P("tp"))
    return [np.asarray(o) for o in jax.jit(f)(X)]


def _reference(mesh: Any, case: Case) -> np.ndarray:
    cid, kind, state, _typed, ref = case
    if kind == "collective":
        f = jax.shard_map(lambda v: _raw_to_varying(ref(_raw_make(state, v))), mesh=mesh,
                          in_specs=P(), out_specs=P("tp"))
        return np.asarray(jax.jit(f)(X))
    if kind == "op_k":
        return np.stack([np.asarray(ref(_true(state, k), k)) for k in range(N_TP)])
    return np.stack([np.asarray(ref(_true(state, k))) for k in range(N_TP)])


def _compare(got: np.ndarray, want: np.ndarray) -> bool:
    if got.shape != want.shape:
        return False
    if got.dtype == np.bool_ or want.dtype == np.bool_:
        return bool(np.array_equal(got, want))
    return bool(np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-3, atol=2e-3,
                            equal_nan=True))


def scan(mesh: Any, batch_size: int = 24) -> dict[str, Any]:
    """Every case: 'rejected SPMD###', 'ok', or a finding ('SPMD901', 'raw ...', 'wrong',
    'fails at execution ...')."""
    cases: list[Case] = [(cid, kind, s, typed, ref) for cid, kind, typed, ref in _cases()
                         for s in STATES]
    outcome: dict[str, Any] = {}
    accepted: list[Case] = []
    for case in cases:
        key = f"{case[0]} [{case[2]}]"
        try:
            code = _trace(mesh, case)
        except Exception as e:  # noqa: BLE001 - a raw error is a finding, reported below
            outcome[key] = f"raw at trace: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
            continue
        if code is None:
            accepted.append(case)
        elif code == "SPMD901":
            outcome[key] = "SPMD901"
        else:
            outcome[key] = f"rejected {code}"

    def run(batch: list[Case]) -> None:
        try:
            got = _run_batch(mesh, batch)
        except Exception as e:  # noqa: BLE001 - split the batch to name the failing op
            if len(batch) == 1:
                outcome[f"{batch[0][0]} [{batch[0][2]}]"] = (
                    f"fails at execution: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}")
                return
            half = len(batch) // 2
            run(batch[:half])
            run(batch[half:])
            return
        for case, g in zip(batch, got, strict=True):
            key = f"{case[0]} [{case[2]}]"
            outcome[key] = "ok" if _compare(g, _reference(mesh, case)) else "wrong"

    for i in range(0, len(accepted), batch_size):
        run(accepted[i:i + batch_size])
    return outcome


@pytest.fixture(scope="module")
def outcomes() -> dict[str, Any]:
    return scan(jax.make_mesh((2, 4), ("dp", "tp")))


def test_scan_covers_every_row_in_every_state(outcomes: dict[str, Any]) -> None:
    n_rows = len(_cases())
    assert len(outcomes) == n_rows * len(STATES)
    counts = collections.Counter(v.split(" ")[0] for v in outcomes.values())
    # a scan that accepts nothing or rejects nothing tests nothing
    assert counts["ok"] > n_rows and counts["rejected"] > n_rows // 2, counts


def test_every_case_is_rejected_with_a_code_or_runs_with_the_reference_numbers(
        outcomes: dict[str, Any]) -> None:
    bad = {k: v for k, v in outcomes.items() if not (v == "ok" or v.startswith("rejected SPMD"))}
    assert not bad, "\n".join(f"{k}: {v}" for k, v in sorted(bad.items()))
