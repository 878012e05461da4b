# mypy: disable-error-code="empty-body"
"""The static view of spmdtyped: what type checkers see (imported only under `TYPE_CHECKING`).

Encoding (see `shared/reference/mypy_plugin_study.md`): one generic class `SArray[V, U, R]`,
each argument a union of `str` Literals (the axes the value is Varying, Unreduced, Reduced on)
or `Never` for the empty set; every other axis is Invariant. `V` is covariant (an Invariant
value is accepted where a Varying one is expected, as JAX's implicit pvary), `U` and `R` are
invariant (exact). Only standard types are used, so mypy's cache, dmypy and pyright work
unchanged.

Without the plugin every collective, cast and operator returns `SArray[Any, Any, Any]`: no
false errors, and boundary checks (parameters, returns, assignments) still work for the
`Varying[Literal["dp"]]` / axis-vocabulary spellings. With `plugins = spmdtyped.mypy_plugin`
the results are computed by `spmdtyped._rules`, exactly as at runtime.

Parameters are deliberately non-generic (`SArray[Any, Any, Any]`): generic parameters give
false "cannot infer type parameter" errors on union arguments and cost check time; the plugin
re-infers the precise argument types itself. Raw `jax.Array` values (state unknown) are
accepted everywhere.

`to=` of `pcast`/`all_gather` is a plain `str`: a `Literal` parameter would make mypy report a
rule error of the plugin as "no overload variant matches" (the overloads' erased fallback
cannot match a Literal); the plugin checks the target itself (SPMD505).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    Literal,
    Never,
    ParamSpec,
    TypeAlias,
    TypeVar,
    overload,
)
from typing import Annotated as Bool  # noqa: F401  (jaxtyping interop, see _jaxtyping)
from typing import Annotated as Float  # noqa: F401
from typing import Annotated as Inexact  # noqa: F401
from typing import Annotated as Int  # noqa: F401
from typing import Annotated as Num  # noqa: F401
from typing import Annotated as Shaped  # noqa: F401

from typing_extensions import TypeAliasType
from typing_extensions import TypeVar as DefaultTypeVar

from ._rules import SpmdType

if TYPE_CHECKING:  # the module is only ever read by type checkers; keep a runtime import jax-free
    import jax
    import numpy as np

__all__ = [
    # `Float[Varying["dp"], "batch/dp d"]` is `Annotated[Varying["dp"], ...]` for checkers, as
    # jaxtyping does: the state is static, shapes and dtypes are checked at runtime
    "Bool", "Float", "Inexact", "Int", "Num", "Shaped",
    "Invariant", "Partial", "Reduced", "Rep", "SArray", "Shard", "Typed", "Unreduced", "Varying",
    "all_gather", "all_to_all",
    "axis_index", "axis_size", "check_mode", "pbroadcast", "pcast", "pmax", "pmean", "pmin",
    "ppermute", "pshuffle", "psum", "psum_scatter", "pvary", "set_check_mode", "shard_map",
    "typeof", "unwrap", "wrap",
]

_V = TypeVar("_V", bound=str, covariant=True)
_U = TypeVar("_U", bound=str)
_R = TypeVar("_R", bound=str)
_A = TypeVar("_A", bound=str)
_F = TypeVar("_F", bound=Callable[..., Any])
#: the refinement slot (Shard / Partial / Rep per axis, see `SArray`): `Any` unless the plugin
#: knows better, so that every checker without the plugin reads `SArray[V, U, R]` unchanged
_K = DefaultTypeVar("_K", default=Any)
_D = TypeVar("_D")

#: an axis name or a tuple of them (JAX's spelling)
AxisName: TypeAlias = str | tuple[str, ...]
#: an operand of a typed operator: a typed value, a raw JAX value (state unknown), a scalar
Operand: TypeAlias = "SArray[Any, Any, Any] | jax.Array | np.ndarray[Any, Any] | np.generic | float | int"
_Typed: TypeAlias = "SArray[Any, Any, Any]"
_Input: TypeAlias = "SArray[Any, Any, Any] | jax.Array | float | int"


class SArray(Generic[_V, _U, _R, _K]):
    """A typed value: Varying on the axes `V`, Unreduced on `U`, Reduced on `R`.

    `K` (default `Any`; written by the mypy plugin only) refines Varying axes (DESIGN.md §1b):
    a union of str Literals `"tp=S-1"` (Shard over tp of dim -1), `"tp=P"` (Partial), `"tp=R"`
    (Rep), `"tp=I"` (axis_index), `"tp=O"` (owner predicate), `"#2"` (rank 2), always joined
    with `Any`, so that refinements are gradual: every refinement is compatible with every
    other one for mypy's own checks (assignments, arguments, returns); the plugin checks them.

    `shape`, `dtype`, `ndim` and `size` are the local (per-device) ones; `raw` is the JAX value.
    """

    @property
    def raw(self) -> jax.Array: ...
    @property
    def spmd_type(self) -> SpmdType: ...
    @property
    def shape(self) -> tuple[int, ...]: ...
    @property
    def dtype(self) -> np.dtype[Any]: ...
    @property
    def ndim(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def weak_type(self) -> bool: ...
    @property
    def T(self) -> SArray[Any, Any, Any]: ...
    @property
    def mT(self) -> SArray[Any, Any, Any]: ...
    @property
    def at(self) -> _At[_V, _U, _R]: ...

    def __init__(self, raw: Any) -> None: ...
    def __len__(self) -> int: ...

    def __add__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __radd__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __sub__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __rsub__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __mul__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __rmul__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __truediv__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __rtruediv__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __matmul__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __rmatmul__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __pow__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __rpow__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __lt__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __le__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __gt__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __ge__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    # elementwise, like JAX arrays (the runtime makes typed values unhashable)
    def __eq__(self, other: object) -> SArray[Any, Any, Any]: ...  # type: ignore[override]
    def __ne__(self, other: object) -> SArray[Any, Any, Any]: ...  # type: ignore[override]
    def __mod__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __rmod__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __floordiv__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __rfloordiv__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __and__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __rand__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __or__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __ror__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __xor__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __rxor__(self, other: Operand) -> SArray[Any, Any, Any]: ...
    def __invert__(self) -> SArray[Any, Any, Any]: ...
    def __neg__(self) -> SArray[Any, Any, Any]: ...
    def __pos__(self) -> SArray[_V, _U, _R]: ...
    def __abs__(self) -> SArray[Any, Any, Any]: ...
    def __getitem__(self, idx: Any) -> SArray[Any, Any, Any]: ...

    def reshape(self, *shape: int | tuple[int, ...]) -> SArray[Any, Any, Any]: ...
    def transpose(self, *axes: int) -> SArray[Any, Any, Any]: ...
    def astype(self, dtype: Any) -> SArray[Any, Any, Any]: ...
    def squeeze(self, axis: int | tuple[int, ...] | None = None) -> SArray[Any, Any, Any]: ...
    def ravel(self) -> SArray[Any, Any, Any]: ...
    def sum(self, axis: int | tuple[int, ...] | None = None, *, keepdims: bool = False) -> SArray[Any, Any, Any]: ...
    def mean(self, axis: int | tuple[int, ...] | None = None, keepdims: bool = False) -> SArray[Any, Any, Any]: ...
    def max(self, axis: int | tuple[int, ...] | None = None, *, keepdims: bool = False) -> SArray[Any, Any, Any]: ...
    def min(self, axis: int | tuple[int, ...] | None = None, *, keepdims: bool = False) -> SArray[Any, Any, Any]: ...


class _At(Generic[_V, _U, _R]):
    """`x.at`: indexed like `x`, then `.set(v)` / `.add(v)` / ... (JAX's scatter updates)."""

    def __getitem__(self, idx: Any) -> _AtIndex[_V, _U, _R]: ...


class _AtIndex(Generic[_V, _U, _R]):
    """`x.at[idx]`: the update methods; the plugin types each result with the runtime's rule
    (the update's rule on `x`, joined with its rule on a typed `v`)."""

    def set(self, values: Operand, **kwargs: Any) -> SArray[Any, Any, Any]: ...
    def add(self, values: Operand, **kwargs: Any) -> SArray[Any, Any, Any]: ...
    def multiply(self, values: Operand, **kwargs: Any) -> SArray[Any, Any, Any]: ...
    def min(self, values: Operand, **kwargs: Any) -> SArray[Any, Any, Any]: ...
    def max(self, values: Operand, **kwargs: Any) -> SArray[Any, Any, Any]: ...


# The hint spellings. With the plugin, `Varying["dp", "tp"]` and `Typed[...]` are also accepted
# (and bare strings need no axis vocabulary).
Varying: TypeAlias = SArray[_A, Never, Never]
Unreduced: TypeAlias = SArray[Never, _A, Never]
Reduced: TypeAlias = SArray[Never, Never, _A]
Invariant: TypeAlias = SArray[Never, Never, Never]
Typed: TypeAlias = SArray  # plugin-only sugar: Typed[Varying["dp"], Reduced["tp"]]
# Refinements of Varying (DESIGN.md §1b). Without the plugin each is exactly `Varying[axis]`
# (the dim a phantom parameter): `Shard["tp", Literal[-1]]` (the plugin also reads `-1`),
# `Partial["tp"]`, `Rep["tp"]`. With the plugin they refine Varying on that axis, and
# `Shard`/`Partial` take several axes (`Partial["dp", "tp"]`) as `Varying` does.
Shard = TypeAliasType("Shard", SArray[_A, Never, Never], type_params=(_A, _D))
Partial = TypeAliasType("Partial", SArray[_A, Never, Never], type_params=(_A,))
Rep = TypeAliasType("Rep", SArray[_A, Never, Never], type_params=(_A,))


# ---------------------------------------------------------------------------- state of anything

def typeof(x: Any) -> SpmdType:
    """The `SpmdType` of a typed value, or of a raw JAX value inside shard_map."""
    ...


@overload
def wrap(raw: SArray[_V, _U, _R], spmd_type: Any = None) -> SArray[_V, _U, _R]: ...
@overload
def wrap(raw: jax.Array, spmd_type: Any = None) -> SArray[Any, Any, Any]: ...
@overload
def wrap(raw: Any, spmd_type: Any = None) -> Any: ...
def wrap(raw: Any, spmd_type: Any = None) -> Any:
    """A typed value for a raw JAX value (its state read from JAX)."""
    ...


@overload
def unwrap(x: SArray[Any, Any, Any]) -> jax.Array: ...
@overload
def unwrap(x: Any) -> Any: ...
def unwrap(x: Any) -> Any:
    """The JAX value of a typed value (pytrees too)."""
    ...


def local(x: SArray[_V, _U, _R], axis_name: Any) -> SArray[_V, _U, _R]: ...  # issue 15
__all__ += ["local"]
def set_check_mode(on: bool) -> None: ...
def check_mode(on: bool) -> AbstractContextManager[None]: ...


# ---------------------------------------------------------------------------- collectives
# One overload for arrays (typed result, made precise by the plugin) and one for pytrees.

@overload
def psum(x: _Input, axis_name: AxisName, *, axis_index_groups: None = None) -> _Typed: ...
@overload
def psum(x: Any, axis_name: AxisName, *, axis_index_groups: None = None) -> Any: ...
def psum(x: Any, axis_name: AxisName, *, axis_index_groups: None = None) -> Any:
    """Typed `jax.lax.psum`: Varying or Unreduced on the named axes -> Invariant there."""
    ...


@overload
def pmean(x: _Input, axis_name: AxisName, *, axis_index_groups: None = None) -> _Typed: ...
@overload
def pmean(x: Any, axis_name: AxisName, *, axis_index_groups: None = None) -> Any: ...
def pmean(x: Any, axis_name: AxisName, *, axis_index_groups: None = None) -> Any:
    """Typed `jax.lax.pmean`."""
    ...


@overload
def pmax(x: _Input, axis_name: AxisName, *, axis_index_groups: None = None) -> _Typed: ...
@overload
def pmax(x: Any, axis_name: AxisName, *, axis_index_groups: None = None) -> Any: ...
def pmax(x: Any, axis_name: AxisName, *, axis_index_groups: None = None) -> Any:
    """Typed `jax.lax.pmax`."""
    ...


@overload
def pmin(x: _Input, axis_name: AxisName, *, axis_index_groups: None = None) -> _Typed: ...
@overload
def pmin(x: Any, axis_name: AxisName, *, axis_index_groups: None = None) -> Any: ...
def pmin(x: Any, axis_name: AxisName, *, axis_index_groups: None = None) -> Any:
    """Typed `jax.lax.pmin`."""
    ...


@overload
def ppermute(x: _Input, axis_name: AxisName, perm: Sequence[tuple[int, int]]) -> _Typed: ...
@overload
def ppermute(x: Any, axis_name: AxisName, perm: Sequence[tuple[int, int]]) -> Any: ...
def ppermute(x: Any, axis_name: AxisName, perm: Sequence[tuple[int, int]]) -> Any:
    """Typed `jax.lax.ppermute`."""
    ...


@overload
def pshuffle(x: _Input, axis_name: AxisName, perm: Sequence[int]) -> _Typed: ...
@overload
def pshuffle(x: Any, axis_name: AxisName, perm: Sequence[int]) -> Any: ...
def pshuffle(x: Any, axis_name: AxisName, perm: Sequence[int]) -> Any:
    """Typed `jax.lax.pshuffle`."""
    ...


@overload
def pbroadcast(x: _Input, axis_name: AxisName, source: int) -> _Typed: ...
@overload
def pbroadcast(x: Any, axis_name: AxisName, source: int) -> Any: ...
def pbroadcast(x: Any, axis_name: AxisName, source: int) -> Any:
    """Typed `jax.lax.pbroadcast`."""
    ...


@overload
def all_gather(x: _Input, axis_name: AxisName, *, axis_index_groups: None = None, axis: int = 0,
               tiled: bool = False, to: str = "varying") -> _Typed: ...
@overload
def all_gather(x: Any, axis_name: AxisName, *, axis_index_groups: None = None, axis: int = 0,
               tiled: bool = False, to: str = "varying") -> Any: ...
def all_gather(x: Any, axis_name: AxisName, *, axis_index_groups: None = None, axis: int = 0,
               tiled: bool = False, to: str = "varying") -> Any:
    """Typed `jax.lax.all_gather`."""
    ...


@overload
def psum_scatter(x: _Input, axis_name: AxisName, *, scatter_dimension: int = 0,
                 axis_index_groups: None = None, tiled: bool = False) -> _Typed: ...
@overload
def psum_scatter(x: Any, axis_name: AxisName, *, scatter_dimension: int = 0,
                 axis_index_groups: None = None, tiled: bool = False) -> Any: ...
def psum_scatter(x: Any, axis_name: AxisName, *, scatter_dimension: int = 0,
                 axis_index_groups: None = None, tiled: bool = False) -> Any:
    """Typed `jax.lax.psum_scatter`."""
    ...


@overload
def all_to_all(x: _Input, axis_name: AxisName, split_axis: int, concat_axis: int, *,
               axis_index_groups: None = None, tiled: bool = False) -> _Typed: ...
@overload
def all_to_all(x: Any, axis_name: AxisName, split_axis: int, concat_axis: int, *,
               axis_index_groups: None = None, tiled: bool = False) -> Any: ...
def all_to_all(x: Any, axis_name: AxisName, split_axis: int, concat_axis: int, *,
               axis_index_groups: None = None, tiled: bool = False) -> Any:
    """Typed `jax.lax.all_to_all`."""
    ...


@overload
def pvary(x: _Input, axis_name: AxisName) -> _Typed: ...
@overload
def pvary(x: Any, axis_name: AxisName) -> Any: ...
def pvary(x: Any, axis_name: AxisName) -> Any:
    """Invariant -> Varying on the named axes."""
    ...


@overload
def pcast(x: _Input, axis_name: AxisName, *,
          to: str) -> _Typed: ...
@overload
def pcast(x: Any, axis_name: AxisName, *, to: str) -> Any: ...
def pcast(x: Any, axis_name: AxisName, *, to: str) -> Any:
    """Typed `jax.lax.pcast`."""
    ...


def axis_index(axis_name: AxisName) -> SArray[Any, Never, Never]:
    """Typed `jax.lax.axis_index`: Varying on the named axes."""
    ...


class AxisSize(int, Generic[_A]):
    """What `st.axis_size` returns with the mypy plugin: an int that remembers its axes `A` (a
    union of str Literals). `b / n` of a replicated `b` is its share of a partial sum over `A`
    (`_rules.axis_size`), and so is `b * (1 / n)`. Without the plugin `st.axis_size` is an
    `int` (a variable holding it may then be reassigned any int)."""

    @overload  # `1 / n`: a float subclass, as `int.__truediv__(1, n)` would give
    def __rtruediv__(self, other: Literal[1]) -> AxisShare[_A]: ...  # type: ignore[misc]
    @overload
    def __rtruediv__(self, other: int) -> float: ...
    def __rtruediv__(self, other: int) -> float: ...


class AxisShare(float, Generic[_A]):
    """`1 / st.axis_size(axes)`: a float that remembers the axes `A`."""


def axis_size(axis_name: AxisName) -> int:
    """The number of devices along the named axes (`AxisSize` with the mypy plugin)."""
    ...


# ---------------------------------------------------------------------------- shard_map

_S = TypeVar("_S")
_F2 = TypeVar("_F2")
_M = TypeVar("_M", bound=str)
_P = TypeVar("_P")


class StaticSpec(Generic[_P, _U, _R]):
    """A `PartitionSpec` as the mypy plugin reads it from source: `P` the tuple of its
    positional entries (str Literals, tuples of them, None), `U` / `R` its unreduced / reduced
    axes. Only ever a type argument of the two classes below."""


class OutSpecMismatch(Generic[_S, _F2, _M]):
    """What the mypy plugin makes of `st.shard_map(f, out_specs=...)` when `f`'s declared outputs
    do not fit its out_specs (SPMD401): calling it is reported, as calling it raises at runtime.
    `S` are the specs (`StaticSpec`s), `F` the type of `f`, `M` the manual axes (`Never`: all).
    Never seen without the plugin."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


class ShardMapDecorator(Generic[_S, _M]):
    """What the mypy plugin makes of the decorator form `st.shard_map(mesh=..., out_specs=...)`
    when the out_specs are literals (`S`, `M` as for `OutSpecMismatch`): applied to a function,
    it checks the function's declared outputs. Never seen without the plugin."""

    def __call__(self, f: Callable[..., Any], /) -> Callable[..., Any]: ...


class VmapOfGrad(Generic[_F2, _P]):
    """What the mypy plugin makes of `jax.vmap(st.grad(f, ...), ...)`: `F` the gradient
    function's type, `P` the loss type of `f`, the types of the arguments a
    `functools.partial` binds and the differentiated argnums. Calling it checks per-example gradients of
    replicated parameters (SPMD407) and gives `F`'s result. Never seen without the plugin."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


# `in_specs` defaults to JAX's `Infer` sentinel at runtime: `...` here (a default the static
# view does not spell)
@overload
def shard_map(f: _F, /, *, out_specs: Any = None, in_specs: Any = ..., mesh: Any = None,
              axis_names: Any = frozenset(), check_vma: bool = True,
              strict: bool = False) -> Callable[..., Any]: ...
@overload
def shard_map(f: None = None, /, *, out_specs: Any = None, in_specs: Any = ..., mesh: Any = None,
              axis_names: Any = frozenset(), check_vma: bool = True,
              strict: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]: ...
def shard_map(f: Any = None, /, *, out_specs: Any = None, in_specs: Any = ..., mesh: Any = None,
              axis_names: Any = frozenset(), check_vma: bool = True, strict: bool = False) -> Any:
    """Typed `jax.shard_map` (decorator form too): the result takes and returns raw arrays."""
    ...


# ---------------------------------------------------------------------------- for the stub only
# Declarations of the generated pyright stub (`_stubgen.static` renders them) for names mypy
# reads from their runtime definitions (`spmdtyped/__init__` imports those under
# TYPE_CHECKING, and the plugin hooks them by that definition site): not in `__all__`.
# `tests/test_stub_signatures.py` keeps them equal to the runtime's signatures.

def explain(code: str | int) -> str: ...
def allow(*codes: str | int) -> AbstractContextManager[None]: ...


# control flow and autodiff: the carry and the loss keep the types they come in with (a carry's
# joined states are the mypy plugin's; without it the body must return the carry's own type)
_C = TypeVar("_C")
_Y = TypeVar("_Y")
_L = TypeVar("_L")
_Params = ParamSpec("_Params")


def fori_loop(lower: Any, upper: Any, body_fun: Callable[[Any, _C], _C], init_val: _C, *,
              unroll: int | bool | None = None) -> _C: ...
def while_loop(cond_fun: Callable[[_C], Any], body_fun: Callable[[_C], _C], init_val: _C) -> _C: ...
def scan(f: Callable[[_C, Any], tuple[_C, _Y]], init: _C, xs: Any = None,
         length: int | None = None, reverse: bool = False, unroll: int | bool = 1,
         _split_transpose: bool = False) -> tuple[_C, Any]: ...


# the gradient of a first argument `SArray[V, U, R]` is its cotangent `SArray[V, R, U]`
# (Unreduced and Reduced swap: `_rules.cotangent`, checked by the stub generator)
@overload
def value_and_grad(fun: Callable[Concatenate[SArray[_V, _U, _R], _Params], _L],
                   argnums: Literal[0] = 0, has_aux: bool = False, holomorphic: bool = False,
                   allow_int: bool = False
                   ) -> Callable[Concatenate[SArray[_V, _U, _R], _Params], tuple[_L, SArray[_V, _R, _U]]]: ...
@overload
def value_and_grad(fun: Callable[_Params, _L], argnums: int | Sequence[int] = 0,
                   has_aux: bool = False, holomorphic: bool = False,
                   allow_int: bool = False) -> Callable[_Params, tuple[_L, Any]]: ...
def value_and_grad(fun: Callable[..., Any], argnums: int | Sequence[int] = 0,
                   has_aux: bool = False, holomorphic: bool = False,
                   allow_int: bool = False) -> Callable[..., Any]: ...


@overload
def grad(fun: Callable[Concatenate[SArray[_V, _U, _R], _Params], Any], argnums: Literal[0] = 0,
         has_aux: Literal[False] = False, holomorphic: bool = False, allow_int: bool = False
         ) -> Callable[Concatenate[SArray[_V, _U, _R], _Params], SArray[_V, _R, _U]]: ...
@overload
def grad(fun: Callable[_Params, Any], argnums: int | Sequence[int] = 0, has_aux: bool = False,
         holomorphic: bool = False, allow_int: bool = False) -> Callable[_Params, Any]: ...
def grad(fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False,
         holomorphic: bool = False, allow_int: bool = False) -> Callable[..., Any]: ...
