# legs: plugin
"""Precise result types with the plugin: bare strings, multi-axis and mixed hints, every
collective and cast, operators, array methods, generic user code, raw values."""

from typing import Any, Final, TypeVar, assert_type

import jax

import spmdtyped as st
from spmdtyped import Invariant, Reduced, SArray, Typed, Unreduced, Varying
from spmdtyped import Varying as V

_V = TypeVar("_V", bound=str, covariant=True)
_U = TypeVar("_U", bound=str)
_R = TypeVar("_R", bound=str)


def states(x: SArray[_V, _U, _R]) -> SArray[_V, _U, _R]:
    """The four states of `x` without its Shard / Partial refinement."""
    return x

A = TypeVar("A", bound=str)
TP: Final = "tp"
PERM = [(0, 1), (1, 0)]


def hints(a: Varying["dp", "tp"], b: Varying["dp | tp"], c: Typed[Varying["dp"], Reduced["tp"]],
          d: V["my-axis"], e: Typed[Varying["dp"]], f: Typed[Invariant]) -> None:
    assert_type(a, Varying["tp", "dp"])  # union order does not matter
    assert_type(b, Varying["dp", "tp"])
    assert_type(c, Typed[Reduced["tp"], Varying["dp"]])
    assert_type(e, Varying["dp"])
    assert_type(f, Invariant)


def collectives(x: Varying["dp", "tp"], u: Unreduced["tp"], w: Varying["dp"],
                m: Typed[Varying["dp"], Unreduced["tp"]]) -> None:
    assert_type(st.psum(x, "tp"), Varying["dp"])          # axis-set arithmetic
    assert_type(st.psum(x, TP), Varying["dp"])            # a Final constant
    assert_type(st.psum(x, ("dp", "tp")), Invariant)
    assert_type(st.psum(u, "tp"), Invariant)              # completes the pending sum
    assert_type(st.pmean(x, "dp"), Varying["tp"])
    assert_type(st.pmax(x, "dp"), Varying["tp"])
    assert_type(st.pmin(x, ("dp", "tp")), Invariant)
    assert_type(st.ppermute(x, "dp", PERM), Varying["dp", "tp"])
    assert_type(st.pshuffle(x, "dp", [1, 0]), Varying["dp", "tp"])
    assert_type(st.pbroadcast(x, "tp", 0), Varying["dp", "tp"])
    assert_type(st.all_gather(w, "dp"), Varying["dp"])
    assert_type(st.all_gather(w, "dp", to="invarying"), Invariant)
    assert_type(st.all_gather(w, "dp", tiled=True, to="reduced"), Reduced["dp"])
    assert_type(st.psum_scatter(x, "tp", tiled=True), Varying["dp", "tp"])
    assert_type(st.psum_scatter(u, "tp"), Varying["tp"])
    assert_type(st.all_to_all(x, "tp", 0, 1), Varying["dp", "tp"])
    assert_type(st.psum(m, "tp"), Varying["dp"])
    assert_type(states(st.axis_index("dp")), Varying["dp"])  # refined: an axis_index
    assert_type(st.axis_index(("dp", "tp")), Varying["dp", "tp"])
    size: int = st.axis_size("dp")         # an int that remembers its axes (AxisSize)
    assert_type(size * 2, int)


def casts(c: Invariant, r: Reduced["tp"], x: Varying["tp"]) -> None:
    assert_type(st.pvary(c, "dp"), st.Rep["dp"])  # Varying, equal on every device
    assert_type(st.pcast(c, "tp", to="varying"), st.Rep["tp"])
    assert_type(st.pcast(r, "tp", to="varying"), st.Rep["tp"])
    assert_type(st.pcast(c, "tp", to="reduced"), Reduced["tp"])
    assert_type(st.pcast(x, "tp", to="unreduced"), Unreduced["tp"])
    assert_type(st.pcast(1.0, "tp", to="reduced"), Reduced["tp"])


def operators(x: Varying["dp"], w: Varying["tp"], c: Invariant, u: Unreduced["tp"],
              r: Reduced["tp"]) -> None:
    assert_type(x @ w, Varying["dp", "tp"])
    assert_type(x + c, Varying["dp"])
    assert_type(c - x, Varying["dp"])
    assert_type(2.0 * x, Varying["dp"])
    assert_type(x / 3, Varying["dp"])
    assert_type(u + u, Unreduced["tp"])
    assert_type(u * 2.0, Unreduced["tp"])                 # the scalar is cast to Reduced
    assert_type(u / 2.0, Unreduced["tp"])
    assert_type(u * r, Unreduced["tp"])
    assert_type(r * 2.0, Reduced["tp"])
    assert_type(r + r, Reduced["tp"])
    assert_type(r + w, Varying["tp"])                     # JAX casts Reduced to Varying
    assert_type(x < 0.0, Varying["dp"])
    assert_type(1.0 < x, Varying["dp"])
    assert_type(x ** 2, Varying["dp"])
    assert_type(-x, Varying["dp"])
    assert_type(+u, Unreduced["tp"])
    assert_type(abs(x), Varying["dp"])
    assert_type(x @ r, Varying["dp"])                     # matmul drops Reduced


def methods(x: Varying["dp"], u: Unreduced["tp"], r: Reduced["tp"]) -> None:
    assert_type(x.T, Varying["dp"])
    assert_type(u.T, Unreduced["tp"])
    assert_type(u.reshape(4, 2), Unreduced["tp"])
    assert_type(u.sum(axis=0), Unreduced["tp"])
    assert_type(u.mean(), Unreduced["tp"])
    assert_type(r.mean(), Reduced["tp"])
    assert_type(x.max(), Varying["dp"])
    assert_type(u[0], Unreduced["tp"])
    assert_type(r[st.axis_index("tp")], Varying["tp"])  # dynamic index: auto-cast R -> V
    assert_type(x[st.axis_index("tp"), 0], Varying["dp", "tp"])
    assert_type(x.astype("float16"), Varying["dp"])
    assert_type(x.shape, tuple[int, ...])
    assert_type(x.ndim, int)


def generic(x: Varying[A]) -> Varying[A]:
    return x


def generic_use(x: Varying["dp"], y: SArray[Any, Any, Any]) -> None:
    assert_type(generic(x), Varying["dp"])
    assert_type(st.psum(generic(x), "dp"), Invariant)   # re-inferred, not polluted by Any
    assert_type(st.psum(y, "dp"), Any)  # unknown state: mypy joins the array and pytree overloads


def raw_values(raw: jax.Array, x: Varying["dp"], anything: Any, axis: str) -> None:
    # state unknown: accepted, no error, no precision
    assert_type(st.psum(raw, "dp"), SArray[Any, Any, Any])
    assert_type(x + raw, SArray[Any, Any, Any])
    assert_type(st.psum(x, axis), SArray[Any, Any, Any])  # non-literal axis
    st.psum(anything, "dp")
    st.ppermute(st.wrap(raw), "dp", PERM)


def pytree(a: Varying["dp"], b: Varying["dp", "tp"]) -> None:
    assert_type(st.psum((a, b), "dp"), tuple[Invariant, Varying["tp"]])


def boundary(x: Varying["dp", "tp"]) -> Varying["dp"]:
    return st.psum(x, "tp")


def ignored(r: Reduced["tp"]) -> None:
    st.psum(r, "tp")  # type: ignore[spmd-reduced-operand]
    st.psum(r, "tp")  # type: ignore[spmd]


def jaxtyping_hint(x: st.Float[Typed[Varying["dp"], Reduced["tp"]], "batch/dp d"]) -> None:
    assert_type(states(x), Typed[Varying["dp"], Reduced["tp"]])  # and Shard["dp", -2]
    assert_type(st.psum(x.T.sum(-1), "dp"), Reduced["tp"])  # the sum over the batch shard


def typed_numpy(x: Varying["dp"], w: Varying["tp"], u: Unreduced["tp"]) -> None:
    assert_type(st.numpy.tanh(x @ w), Varying["dp", "tp"])
    assert_type(st.numpy.where(x > 0.0, x, 0.0), Varying["dp"])
    assert_type(st.numpy.concatenate([x, w]), Varying["dp", "tp"])
    assert_type(st.numpy.einsum("ij,jk->ik", x, w), Varying["dp", "tp"])
    assert_type(st.numpy.maximum(x, w), Varying["dp", "tp"])
    assert_type(st.numpy.sum(u, axis=0), Unreduced["tp"])
    assert_type(st.numpy.roll(u, 1), Unreduced["tp"])
    assert_type(st.numpy.reshape(u, (2, 4)), Unreduced["tp"])


def loss_fn(w: Invariant, r: Reduced["dp"], x: Varying["dp"]) -> Varying["dp"]:
    return (x @ w + x @ r).sum()


def autodiff(w: Invariant, r: Reduced["dp"], x: Varying["dp"]) -> None:
    loss, (gw, gr) = st.value_and_grad(loss_fn, argnums=(0, 1))(w, r, x)
    assert_type(loss, Varying["dp"])
    assert_type(gw, Invariant)            # JAX already summed it over dp
    assert_type(gr, Unreduced["dp"])      # Reduced parameter: Unreduced gradient (ZeRO)
    assert_type(st.grad(loss_fn, argnums=1)(w, r, x), Unreduced["dp"])
    assert_type(st.psum_scatter(gr, "dp", tiled=True), Varying["dp"])
    # a lambda called at once: typed from the arguments (mypy alone gives its parameters Any)
    value, g = st.value_and_grad(lambda p: (x @ p).sum())(r)
    assert_type(value, Varying["dp"])
    assert_type(g, Unreduced["dp"])
    assert_type(st.grad(lambda p, q: (x @ p + x @ q).sum(), argnums=(0, 1))(w, r),
                tuple[Invariant, Unreduced["dp"]])
