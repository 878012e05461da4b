"""Every error page's fixed code computes the numbers its wrong code most likely meant (issue
26): `after` runs on 8 devices and each device's result is compared with a single-device
NumPy / JAX reference of what `before` meant (`REFERENCE`). A fix that changes the numbers
must say so on its page (SPMD101's pcast route, SPMD301's psum_scatter, SPMD505's targets).

How a page's code runs is `tests/test_error_messages.py`'s `EXAMPLES` (the names bound in
which states, the setup); here the body is executed, not only traced, with one value `V`
brought to each state. Each device's result is brought to a comparable per-device value: an
Unreduced one is summed (its true value), a Reduced one cast to Varying (free, same values).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from test_error_messages import EXAMPLES, _compile, _in_state

import spmdtyped as st
from spmdtyped import _errors
from spmdtyped._typed.hints import is_state_class

V = (np.arange(64, dtype=np.float32).reshape(8, 8) / 64.0 + 0.5)
ALL = ("dp", "tp")
ONES = np.ones((8, 8), np.float32)


def _loop_grad(v: np.ndarray) -> np.ndarray:
    def loss(w: Any) -> Any:
        return jax.lax.fori_loop(0, 2, lambda i, h: jnp.tanh(h @ w), jnp.asarray(v)).sum()

    return np.asarray(2 * jax.grad(loss)(jnp.asarray(v)))  # the loss of both dp devices


def _per_example(v: np.ndarray) -> np.ndarray:
    def net(p: Any, x: Any) -> Any:
        return jnp.sin((p * x).sum())

    return np.asarray(jax.vmap(jax.grad(net), in_axes=(None, 0))(jnp.asarray(v), jnp.asarray(v)))


def _unsummed(v: np.ndarray) -> np.ndarray:
    """SPMD410's gradient on one device: the whole batch's (the page's `w` and `x`)."""
    w = jnp.asarray(np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4))
    x = jnp.asarray(np.linspace(-2, 2, 64, dtype=np.float32).reshape(8, 8))
    return np.asarray(jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w))


def _tp_gradient(v: np.ndarray) -> np.ndarray:
    """SPMD411's gradient of w1 on one device (the page's `w1`, `w2`, `x`)."""
    w1 = jnp.asarray(np.linspace(-1, 1, 128, dtype=np.float32).reshape(8, 16))
    w2 = jnp.asarray(np.linspace(-1, 1, 64, dtype=np.float32).reshape(16, 4))
    x = jnp.asarray(np.linspace(-2, 2, 64, dtype=np.float32).reshape(8, 8))
    return np.asarray(jax.grad(lambda w1: jnp.mean((jnp.tanh(x @ w1) @ w2) ** 2))(w1))


def _stack_gradient(v: np.ndarray) -> np.ndarray:
    """SPMD412's gradient of the stacked w1 on one device (the page's `w1`, `w2`, `x`)."""
    w1 = jnp.asarray(np.linspace(-1, 1, 256, dtype=np.float32).reshape(2, 8, 16))
    w2 = jnp.asarray(np.linspace(-1, 1, 256, dtype=np.float32).reshape(2, 16, 8))
    x = jnp.asarray(np.linspace(-2, 2, 64, dtype=np.float32).reshape(8, 8))

    def loss(w1: Any) -> Any:
        h = x
        for i in range(2):
            h = h + jnp.tanh(h @ w1[i]) @ w2[i]
        return jnp.mean(h ** 2)

    return np.asarray(jax.grad(loss)(w1))


def _attention(v: np.ndarray) -> np.ndarray:
    """SPMD216's attention on one device: every query against every key (the page's `q`,
    `k`, `v`)."""
    q, k, w = (np.linspace(-1, 1, 256, dtype=np.float32).reshape(2, 16, 8) * s
               for s in (1.0, -0.5, 2.0))
    return np.asarray(jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, k), -1) @ w)


#: code -> (the result's name, its reference as a function of V (or of V, the dp index, the tp
#: index)); for "top" pages the name is the variable `after` assigns or "_" for its last
#: expression
REFERENCE: dict[str, tuple[str, Callable[..., Any]]] = {
    "SPMD101": ("y", lambda v: np.stack([v, v])),           # the gathered w: no second sum
    "SPMD102": ("g", lambda v: 4 * v),
    "SPMD103": ("g", lambda v: 2 * v),                        # one sum over dp, not n * g
    "SPMD104": ("y", lambda v: 2 * v),
    "SPMD105": ("m", lambda v: 4 * v),
    "SPMD106": ("y", lambda v: 4 * v),
    "SPMD107": ("y", lambda v: 4 * v),
    "SPMD108": ("g", lambda v: 2 * v),
    "SPMD201": ("y", lambda v: 5 * v),
    "SPMD202": ("y", lambda v: np.tanh(4 * v)),
    "SPMD203": ("y", lambda v: v * v),
    "SPMD204": ("y", lambda v: 2 * v),
    "SPMD205": ("y", lambda v: 2 * v),
    "SPMD210": ("y", lambda v: 4 * (v @ v) + v),
    "SPMD211": ("y", lambda v: np.tanh(4 * (v @ v))),
    "SPMD212": ("loss", lambda v: (v * v).sum() / v.sum()),
    "SPMD213": ("y", lambda v: np.where(v > 0, 4 * v, 0.0)),
    "SPMD215": ("s", lambda v: 2 * v),
    "SPMD216": ("out", _attention),                            # all keys, not the local ones
    "SPMD301": ("v", lambda v: 4 * v),                        # the summed value, full shape
    "SPMD302": ("acc", lambda v: 4 * v + 3 * (2 * 4 * v)),    # acc0 + n parts, summed once
    "SPMD303": ("_f", lambda v, d, t: np.float32(2.0 if d == 0 else 3.0)),
    "SPMD401": ("_", lambda v: ONES),
    "SPMD402": ("_", lambda v: ONES.sum(0)),
    "SPMD404": ("g", lambda v: np.ones_like(v)),
    "SPMD405": ("g", lambda v: np.ones_like(v)),
    "SPMD406": ("g", _loop_grad),
    "SPMD407": ("g", _per_example),
    "SPMD408": ("_f", lambda v: np.float32(8 * 64.0)),       # every row of x @ g, squared
    "SPMD409": ("y", lambda v: 2 * ONES),
    "SPMD410": ("g", _unsummed),                               # the whole batch's gradient
    "SPMD411": ("g1", _tp_gradient),                           # once, not tp's size times
    "SPMD412": ("g1", _stack_gradient),                        # the layers below right too
    "SPMD501": ("y", lambda v: 4 * v),
    "SPMD502": ("y", lambda v: 8 * v),
    "SPMD503": ("_", lambda v: ONES[:4] + ONES[4:]),
    "SPMD505": ("y", lambda v: 2 * v),                        # a sum, as the page says
    "SPMD506": ("y", lambda v: ONES[:4] + ONES[4:]),
    "SPMD901": ("y", lambda v: v),
    "SPMD902": ("noisy", lambda v, d, t: v + d),
}

#: pages whose fixed code computes no numbers to compare (declarations, hints, codes, specs)
NO_NUMBERS = {
    "SPMD403": "a spec on an Explicit mesh: the program is the identity; what it fixes is the spec",
    "SPMD504": "a hint",
    "SPMD507": "a custom op declaration",
    "SPMD508": "explain / allow",
    "SPMD509": "a shard_map built with the right mesh (not called)",
    # the communication report's flags: a fix changes what a step sends, not what it computes
    # (test_error_messages runs each page's programs; tests/test_report.py compares the numbers
    # of the gradient-accumulation pair)
    **dict.fromkeys(("SPMD701", "SPMD702", "SPMD703", "SPMD704", "SPMD705"),
                    "a flag of st.report: the fix changes the communication, not the numbers"),
}


def test_every_page_has_a_reference_or_a_reason() -> None:
    assert set(REFERENCE) | set(NO_NUMBERS) == set(_errors.REGISTRY)
    assert not set(REFERENCE) & set(NO_NUMBERS)


def _per_device(y: Any) -> Any:
    """A device's result as a Varying value over every axis, with a leading axis of one."""
    if not is_state_class(type(y)):
        y = st.wrap(jnp.asarray(y))
    t = st.typeof(y)
    if t.unreduced:
        y = st.psum(y, tuple(sorted(t.unreduced)))
    t = st.typeof(y)
    if t.reduced:
        y = st.pcast(y, tuple(sorted(t.reduced)), to="varying")
    y = st.local(y, ALL)  # the refinement is not compared
    invariant = tuple(a for a in ALL if a not in st.typeof(y).varying)
    if invariant:
        y = st.pvary(y, invariant)
    return y[None]


def _expected(code: str, v: np.ndarray) -> np.ndarray:
    fn = REFERENCE[code][1]
    if fn.__code__.co_argcount == 3:
        return np.stack([np.asarray(fn(v, k // 4, k % 4)) for k in range(8)])
    return np.stack([np.asarray(fn(v))] * 8)


def _run_body(mesh: Any, code: str) -> np.ndarray:
    _kind, given, setup = EXAMPLES[code]
    name = REFERENCE[code][0]
    source = _errors.REGISTRY[code].after

    def body(v: Any) -> Any:
        ns: dict[str, Any] = {"st": st, "jax": jax, "jnp": jnp, "P": P, "mesh": mesh}
        ns.update({n: _in_state(v, spec) for n, spec in given.items()})
        exec(_compile(setup + "\n" + source), ns)  # noqa: S102 - the page's own code
        return _per_device(ns[name])

    x = jax.device_put(jnp.asarray(V), NamedSharding(mesh, P()))
    return np.asarray(st.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P(ALL))(x))


def _run_top(mesh: Any, code: str) -> np.ndarray:
    _kind, _given, setup = EXAMPLES[code]
    name = REFERENCE[code][0]
    tree = ast.parse(_errors.REGISTRY[code].after)
    last = tree.body[-1]
    if name == "_" and isinstance(last, ast.Expr):  # the last expression's value
        tree.body[-1] = ast.Assign(targets=[ast.Name("_", ast.Store())], value=last.value)
        ast.fix_missing_locations(tree)
    ns: dict[str, Any] = {"st": st, "jax": jax, "jnp": jnp, "P": P, "mesh": mesh}
    ns["x"] = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P("dp")))
    ns["b"] = jax.device_put(jnp.ones(()), NamedSharding(mesh, P()))
    exec(_compile(setup), ns)  # noqa: S102
    exec(_compile(ast.unparse(tree), "after"), ns)  # noqa: S102
    if name == "_f":  # an `infer` page: run its function with the same specs, checked
        if code == "SPMD303":
            f = st.adapters.typed_shard_map(ns["f"], mesh=mesh, in_specs=P(), out_specs=P("dp"))
            out = np.asarray(f(ns["b"]))                          # one value per dp device
            return np.repeat(out, 4, axis=0)                      # as 8 device rows
        f = st.adapters.typed_shard_map(ns["f"], mesh=mesh, in_specs=(P(), P("dp")),
                                        out_specs=P())
        return np.stack([np.asarray(f(ns["g"], ns["x"]))] * 8)
    return np.stack([np.asarray(ns[name])] * 8)


@pytest.mark.parametrize("code", sorted(REFERENCE))
def test_fixed_code_computes_what_the_wrong_code_meant(mesh_dp_tp: Any, code: str) -> None:
    kind = EXAMPLES[code][0]
    got = _run_body(mesh_dp_tp, code) if kind == "body" else _run_top(mesh_dp_tp, code)
    want = _expected(code, V if kind == "body" else ONES)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-5,
                               atol=1e-5, err_msg=f"{code}: {_errors.REGISTRY[code].after}")


@pytest.mark.parametrize("code,fragment", [
    ("SPMD101", "changes the numbers"), ("SPMD301", "changes the numbers"),
    ("SPMD505", "each computes different numbers"),
])
def test_a_fix_that_changes_the_numbers_says_so(code: str, fragment: str) -> None:
    assert fragment in st.explain(code)
