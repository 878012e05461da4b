"""The only module that knows JAX versions and private APIs.

Supported: jax 0.10.2 (Python 3.11 leg) and jax 0.12.x (Python 3.12 leg). Each private use
names the version and why.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import core as _jcore  # private, same in 0.10 and 0.12: get_axis_env only
from jax.sharding import PartitionSpec

from ._rules import INVARIANT, JAX_0_10, JAX_0_12, JAX_0_12_1, UNKNOWN, Features, SpmdType
from ._rules.caching import hashable_cache
from ._typed import hints as _hints
from ._typed.hints import state_class


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for p in v.split("."):
        digits = "".join(ch for ch in p if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


JAX_VERSION = _version_tuple(jax.__version__)
#: the rule differences of the installed JAX (see `_rules.Features`)
FEATURES: Features = (JAX_0_12_1 if JAX_VERSION >= (0, 12, 1) else JAX_0_12 if JAX_VERSION >= (0, 11)
                      else JAX_0_10)

# jax.extend.source_info_util.register_exclusion (0.10 and 0.12): spmdtyped's frames are not
# the user's, as jax's own are not. The source locations JAX records for every equation (HLO
# metadata, debug info, JAX's messages) then name the user's line, as in the raw program,
# not spmdtyped/_typed/array.py; and lowering turns fewer frames into locations.
try:
    from jax.extend import source_info_util as _source_info_util

    _source_info_util.register_exclusion(os.path.dirname(os.path.abspath(__file__)) + os.sep)
except (ImportError, AttributeError):  # pragma: no cover - an older/newer jax.extend
    pass


def _kind_name(kind: Any) -> str | None:
    # [0.12] ManualAxisType.unreduced_kind is None or jax.sharding.UnreducedKind.{sum,max,min};
    # [0.10] the field does not exist.
    if kind is None:
        return None
    return str(getattr(kind, "name", kind)).split(".")[-1]


#: ManualAxisType -> SpmdType. JAX interns ManualAxisType (0.10 and 0.12: weak_value_interner,
#: identity hash), so this is one dict look-up per value; the strong keys keep them interned.
_MAT_TYPES: dict[Any, SpmdType] = {}


def mat_to_spmd(mat: Any) -> SpmdType:
    t = _MAT_TYPES.get(mat)
    if t is None:
        t = _MAT_TYPES[mat] = _mat_to_spmd(mat.varying, mat.unreduced, mat.reduced,
                                           getattr(mat, "unreduced_kind", None))
    return t


@functools.lru_cache(maxsize=1024)
def _mat_to_spmd(v: frozenset[str], u: frozenset[str], r: frozenset[str], kind: Any) -> SpmdType:
    # the state class's own SpmdType: `typeof_raw(x) is type(typed)._spmd_type` for equal
    # states, so hint checks and check mode compare by identity first
    return state_class(SpmdType(v, u, r, _kind_name(kind)))._spmd_type  # type: ignore[return-value]


_Tracer = jax.core.Tracer  # public in 0.10 and 0.12


def typeof_raw(x: Any) -> SpmdType:
    """The state of a raw JAX value: `jax.typeof(x).manual_axis_type` (public in 0.10 and 0.12)."""
    # (a tracer's abstract value is its `aval`, what `jax.typeof` returns for it after a
    # look-up along its class's MRO: read directly, once per typed op in check mode)
    aval = x.aval if isinstance(x, _Tracer) else jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)
    if mat is None:
        return INVARIANT
    return mat_to_spmd(mat)


def typeof_raw_or_none(x: Any) -> SpmdType | None:
    # a Tracer first: a plain class test, where jax.Array's ABC check costs ~1 us
    if isinstance(x, _Tracer) or isinstance(x, jax.Array):
        try:
            return typeof_raw(x)
        except TypeError:
            return None
    return None


_hints.register_raw_typeof(typeof_raw_or_none)


def current_mesh() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(mesh axis names, manual axis names) of the enclosing shard_map; ((), ()) outside."""
    # jax.sharding.get_abstract_mesh is public in 0.10 and 0.12; inside shard_map the manual
    # axes have AxisType.Manual.
    m = jax.sharding.get_abstract_mesh()
    names = tuple(getattr(m, "axis_names", ()) or ())
    if not names:
        return (), ()
    manual = tuple(getattr(m, "manual_axes", ()) or ())
    return names, manual


def asarray_like(c: Any, like: Any) -> Any:
    # jnp.asarray gives a traced constant that pcast(to='reduced') accepts; lax.full and NumPy
    # scalars hit the bare AssertionError of reference Q13 on 0.10.
    # An explicit dtype is needed: jnp.asarray(2.0) (no dtype) also hits Q13 on 0.10 and 0.12.
    # A complex literal next to a real array takes the promoted (complex) dtype, as JAX's
    # weak-type promotion gives it.
    dtype = jnp.result_type(like, c) if hasattr(like, "dtype") else jnp.result_type(c)
    return jnp.asarray(c, dtype=dtype)


# ------------------------------------------------------------------- binding collectives
# All public jax.lax entry points in both versions; JAX dispatches on the input state itself
# (psum on U -> unreduced_psum, pcast to='varying' on R -> reduced_vary_cast).

#: jax.lax's namespace as it was when spmdtyped loaded: `st.adapters.typed_shard_map` routes
#: `jax.lax.<name>` through `spmdtyped.lax` while a body traces, and a binding must not loop
_LAX = dict(vars(lax))


@functools.cache
def _resolve(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    if module == "jax.lax":
        return _LAX[name]
    return getattr(importlib.import_module(module), name)


def resolve(dotted: str) -> Any:
    """The callable a collective-table row names (`jax.lax.psum`,
    `spmdtyped._compat.pbroadcast`); `jax.lax.*` as it was before any routing."""
    return _resolve(dotted)


# The plain ones are bound as the collective table names them (`resolve("jax.lax.psum")`);
# here only the bindings that need more than JAX's function.


def pbroadcast(x: Any, axis_name: Any, source: Any) -> Any:
    # jax.lax.pbroadcast (0.10 and 0.12) binds its primitive with axis_name as given, and the
    # primitive iterates it: a str "dp" becomes the axes ("d", "p"). Always pass a tuple.
    axes = (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)
    t = typeof_raw_or_none(x)
    if not _pbroadcast_lowers() and (t is None or not (t.unreduced or t.reduced)):
        # (with Unreduced/Reduced on other axes the select would drop them: bind pbroadcast)
        # jax 0.10 and 0.12 have no CPU lowering for pbroadcast (NotImplementedError at
        # compile time); bind the equivalent JAX documents for it, typed as pbroadcast is
        # (Varying): psum of the source's shard, then a free cast back to Varying.
        masked = jnp.where(lax.axis_index(axes) == source, x, jnp.zeros_like(x))
        return lax.pcast(lax.psum(masked, axes), axes, to="varying")
    return lax.pbroadcast(x, axes, source)


@functools.cache
def _pbroadcast_lowers() -> bool:
    # the MLIR rule for pbroadcast exists for GPU/TPU only (jax 0.10.2, 0.12.0.1)
    return jax.devices()[0].platform != "cpu"


def batch_axis_names(mesh_axes: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Names bound by an enclosing `jax.vmap(axis_name=...)`/pmap that are not mesh axes
    (`mesh_axes`: `current_mesh()[0]`, when the caller has read it)."""
    # jax._src.core.get_axis_env (private; same in 0.10 and 0.12): the named axes in scope,
    # mesh axes of an enclosing shard_map included. No public API lists vmap axis names.
    names = _jcore.get_axis_env().axis_names()
    if mesh_axes is None:
        mesh_axes = current_mesh()[0]
    return tuple(a for a in names if isinstance(a, str) and a not in mesh_axes)
axis_index = lax.axis_index


def all_gather(x: Any, axis_name: Any, *, axis: int, tiled: bool, to: str,
               axis_index_groups: Any = None) -> Any:
    return lax.all_gather(x, axis_name, axis_index_groups=axis_index_groups, axis=axis, tiled=tiled,
                          to=to)


def pcast(x: Any, axis_name: Any, *, to: str) -> Any:
    return lax.pcast(x, axis_name, to=to)


def vary_cast_source(expr: str, axes: tuple[str, ...], lax_name: str = "jax.lax") -> str:
    """The source text that casts `expr` to Varying over `axes` in the installed JAX, for code
    that `port --enable-vma` writes (`lax_name`: how the module names `jax.lax`)."""
    # jax.lax.pcast(x, axes, to="varying") is public in 0.10 and 0.12; older JAX (0.6-0.7)
    # spelled the same cast jax.lax.pvary(x, axes)
    if hasattr(lax, "pcast"):
        return f"{lax_name}.pcast({expr}, {axes!r}, to='varying')"
    return f"{lax_name}.pvary({expr}, {axes!r})"  # pragma: no cover - jax < 0.8


def axis_size(axis_name: Any) -> int:
    # jax.lax.axis_size is public in 0.10 and 0.12 and returns a Python int.
    return int(lax.axis_size(axis_name))


# ------------------------------------------------------------------- shard_map


#: `jax.shard_map` as imported (spmdtyped's own shard_maps are JAX's, bound once)
JAX_SHARD_MAP = jax.shard_map


def shard_map(f: Any, *, mesh: Any, in_specs: Any, out_specs: Any, axis_names: Any,
              check_vma: bool) -> Any:
    kw: dict[str, Any] = dict(mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma)
    if axis_names:
        kw["axis_names"] = set(axis_names)
    return JAX_SHARD_MAP(f, **kw)


#: `jax.shard_map`'s default `in_specs` (0.10 and 0.12: `jax.sharding.Infer` in its repr, not
#: an attribute of the public module; read from the signature): infer the specs from the
#: arguments' shardings (needs an Explicit mesh).
INFER: Any = inspect.signature(jax.shard_map).parameters["in_specs"].default


def context_mesh(concrete: bool = False) -> Any:
    """The mesh `jax.set_mesh` made current (None when there is none): the abstract mesh, or
    with `concrete=True` (outside `jax.jit` only) the `Mesh` with devices."""
    # jax.sharding.get_mesh / get_abstract_mesh are public in 0.10 and 0.12; get_mesh raises
    # inside jax.jit, where only the abstract mesh exists.
    if concrete:
        try:
            m = jax.sharding.get_mesh()
        except ValueError:
            m = None
        if m is not None and getattr(m, "axis_names", ()):
            return m
    m = jax.sharding.get_abstract_mesh()
    return m if getattr(m, "axis_names", ()) else None


def inferred_specs(args: Any) -> tuple[Any, ...]:
    """`in_specs=jax.sharding.Infer` resolved as JAX resolves it: each argument leaf's
    sharding spec (P() for a leaf without one, e.g. a ShapeDtypeStruct or a Python scalar)."""
    def spec(leaf: Any) -> Any:
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            try:
                sharding = jax.typeof(leaf).sharding
            except TypeError:
                sharding = None
        return getattr(sharding, "spec", None) or PartitionSpec()

    return tuple(jax.tree_util.tree_map(spec, a) for a in args)


def staged_shard_map_eqn(out: Any) -> Any:
    """The `shard_map` equation that produced the traced outputs `out` in the current jaxpr
    trace (None when `out` is not from one, e.g. under an eager grad or vmap)."""
    # DynamicJaxprTracer.parent (private, 0.10 and 0.12): the TracingEqn that produced the
    # tracer, with .primitive and .params (the inner `jaxpr`, in/out specs) as in a jaxpr.
    for leaf in jax.tree_util.tree_leaves(out):
        eqn = getattr(leaf, "parent", None)
        if eqn is not None and str(getattr(eqn, "primitive", "")) == "shard_map" \
                and "jaxpr" in getattr(eqn, "params", {}):
            return eqn
        return None
    return None


def spec_entries(spec: Any) -> tuple[Any, ...]:
    """The per-dimension entries of a PartitionSpec (None, an axis name or a tuple of names)."""
    # PartitionSpec.partitions (0.10 and 0.12): iterating a spec with reduced/unreduced raises.
    return tuple(spec.partitions if hasattr(spec, "partitions") else tuple(spec))


@hashable_cache(1024)   # (read once per spec: a program's 768 parameters share a few specs)
def spec_parts(spec: Any) -> tuple[tuple[str, ...], frozenset[str], frozenset[str], str | None]:
    """(partitioned axes in order, unreduced, reduced, unreduced kind) of a PartitionSpec."""
    part = [a for e in spec_entries(spec) if e is not None for a in ((e,) if isinstance(e, str) else e)]
    # PartitionSpec.unreduced/.reduced exist in 0.10 and 0.12; unreduced_kind only in 0.12.
    un = frozenset(getattr(spec, "unreduced", ()) or ())
    red = frozenset(getattr(spec, "reduced", ()) or ())
    kind = _kind_name(getattr(spec, "unreduced_kind", None)) if un else None
    return tuple(part), un, red, kind


def is_spec(x: Any) -> bool:
    return isinstance(x, PartitionSpec)


def mesh_axis_names(mesh: Any) -> tuple[str, ...]:
    return tuple(mesh.axis_names)


def mesh_axis_sizes(mesh: Any) -> dict[str, int]:
    return dict(zip(mesh.axis_names, mesh.axis_sizes if hasattr(mesh, "axis_sizes")
                    else mesh.devices.shape, strict=True))


# ------------------------------------------------------------------- jaxprs (adapters)


def check_vma_enabled() -> bool:
    """Whether the enclosing shard_map checks manual-axis types (`check_vma=True`)."""
    # jax._src.config._check_vma (private, 0.10 and 0.12): shard_map sets it while tracing
    # its body; with check_vma=False every value is Invariant and JAX binds plain `psum`.
    from jax._src import config as _config

    return bool(_config._check_vma.value)


# [0.10] two cast primitives carry a `_p` suffix that [0.12] dropped (reference §2.3).
_PRIMITIVE_ALIASES = {"vary_unreduced_cast_p": "vary_unreduced_cast",
                      "reduced_vary_cast_p": "reduced_vary_cast"}


def primitive_name(eqn: Any) -> str:
    """The primitive of a jaxpr equation under its 0.12 name."""
    name = eqn.primitive.name
    return _PRIMITIVE_ALIASES.get(name, name)


def eqn_frames(eqn: Any) -> tuple[tuple[str, int, str], ...]:
    """(file, line, function) of the Python stack that bound `eqn`, innermost first."""
    tb = getattr(getattr(eqn, "source_info", None), "traceback", None)
    if tb is None:
        return ()
    return _traceback_frames(tb)


@functools.lru_cache(maxsize=1 << 16)
def _traceback_frames(tb: Any) -> tuple[tuple[str, int, str], ...]:
    # a jaxlib Traceback (0.10, 0.12: hashable); frames have file_name/function_name and
    # start_line (older: line_num). Reading them costs tens of µs; every walk reads them all.
    return tuple((f.file_name, int(getattr(f, "start_line", getattr(f, "line_num", 0)) or 0),
                  f.function_name) for f in tb.frames)


def eqn_lastis(eqn: Any) -> tuple[int, ...]:
    """Each frame's bytecode offset, as `eqn_frames` lists them (two calls on one line differ)."""
    tb = getattr(getattr(eqn, "source_info", None), "traceback", None)
    return () if tb is None else tuple(tb.raw_frames()[1])


def shard_map_manual_axes(eqn: Any) -> tuple[str, ...]:
    """The mesh axes a staged shard_map equation makes manual, in mesh order (0.10, 0.12)."""
    mesh = eqn.params["mesh"]
    manual = eqn.params.get("newly_manual_axes")
    names = mesh_axis_names(mesh)
    return names if manual is None else tuple(a for a in names if a in manual)


def jaxpr_source(jaxpr: Any) -> tuple[str, int] | None:
    """`(file, line)` of the function a jaxpr was traced from ("f at file.py:12"), or None."""
    info = getattr(getattr(jaxpr, "jaxpr", jaxpr), "debug_info", None)
    src = str(getattr(info, "func_src_info", "") or "")
    _, at, place = src.rpartition(" at ")
    file, colon, line = place.rpartition(":")
    if not at or not colon or not line.isdigit():
        return None
    return file, int(line)


def eqn_transforms(eqn: Any) -> tuple[str, ...]:
    """The transformations that generated `eqn`, outermost first, from its name stack
    (`("vmap", "transpose", "jvp")`: the backward pass of `jax.vmap(jax.grad(f))`)."""
    # name stacks are values: a program has few distinct ones
    return _transforms(getattr(getattr(eqn, "source_info", None), "name_stack", None))


@hashable_cache(4096)
def _transforms(names: Any) -> tuple[str, ...]:
    stack = getattr(names, "stack", ())
    return tuple(getattr(t, "name", "") for t in stack if type(t).__name__ == "Transform")


def sub_jaxprs(eqn: Any) -> list[Any]:
    """The open jaxprs nested in an equation's params (jit, scan, while, cond branches,
    custom_jvp/vjp, remat, nested shard_map); [0.12] stores some as open `Jaxpr`s, [0.10]
    as `ClosedJaxpr`s."""
    out: list[Any] = []
    for v in eqn.params.values():
        for s in v if isinstance(v, (tuple, list)) else (v,):
            if hasattr(s, "eqns"):
                out.append(s)
            elif hasattr(getattr(s, "jaxpr", None), "eqns"):
                out.append(s.jaxpr)
    return out


def literal_value(v: Any) -> object | None:
    """The Python value of a scalar `Literal` operand of a jaxpr equation (None for a `Var` or
    a non-scalar). Literals carry `.val` in jax 0.10 and 0.12 (`jax.core.Literal` is not
    exported by either; a `Var` has no `.val`)."""
    val = getattr(v, "val", None)
    if val is None or getattr(v, "count", None) is not None:
        return None
    if type(val) in (int, float, bool, complex):   # (most: `x * 2.0`; what `.item()` gives)
        return val
    arr = np.asarray(val)
    return arr.item() if arr.size == 1 else None


@hashable_cache(256)   # (the walks ask once per equation)
def dtype_name(dtype: Any) -> object:
    """The NumPy name of a dtype (`"int32"`, `"bool"`, `"bfloat16"`), `UNKNOWN` if none."""
    try:
        return str(np.dtype(dtype)) if dtype is not None else UNKNOWN
    except TypeError:
        return UNKNOWN


def aval_type(aval: Any) -> SpmdType:
    """The manual-axis state recorded in an abstract value (Invariant when it has none)."""
    mat = getattr(aval, "manual_axis_type", None)
    return SpmdType() if mat is None else mat_to_spmd(mat)


def rejected_operands(e: BaseException) -> tuple[frozenset[str], frozenset[str]] | None:
    """[0.12.1] `(unreduced, reduced)`: the axes on which the operands JAX's `call_ur_rule`
    rejected when it raised `e` are Unreduced and Reduced (`unreduced/reduced rule for cumsum
    is not implemented`: the message names neither). Read from that frame's `avals` where the
    traceback (or the unfiltered copy JAX chains as the cause) still holds it; under JAX's
    default traceback filtering it does not, and the innermost frame left (the `jnp` function
    or the user's line that called the primitive) is read instead: the states of the traced
    values it holds. None when neither says."""
    seen: set[int] = set()
    err: BaseException | None = e
    innermost = None
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        tb = err.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            if frame.f_code.co_name == "call_ur_rule" and "avals" in frame.f_locals \
                    and frame.f_globals.get("__name__", "").startswith("jax."):
                return _joined([aval_type(a) for a in frame.f_locals["avals"]])
            if innermost is None and tb.tb_next is None:
                innermost = frame
            tb = tb.tb_next
        err = err.__cause__
    if innermost is None:
        return None
    held = [typeof_raw_or_none(v) for v in innermost.f_locals.values()
            if isinstance(v, _Tracer)]
    return _joined([t for t in held if t is not None]) or None


def _joined(types: list[SpmdType]) -> tuple[frozenset[str], frozenset[str]] | None:
    u = frozenset().union(*(t.unreduced for t in types))
    r = frozenset().union(*(t.reduced for t in types))
    return (u, r) if u or r else None


def register_value_handler(cls: type, handler: Any) -> None:
    """Let `jax.lax` primitives accept instances of `cls`: `Primitive.bind` canonicalises each
    argument through `jax._src.dtypes.canonicalize_value` (jax 0.10.2 and 0.12: private API,
    the only hook that turns a non-array object into a JAX value at bind time; `__jax_array__`
    is refused there since jax 0.8)."""
    from jax._src import core, dtypes

    dtypes.register_canonicalize_value_handler(cls, handler)
    # `jax.typeof(x)` (used before bind by lax.dot_general's resharding and others): the raw
    # value's type; jax 0.10.2 and 0.12 look the class up in this private table first
    core.pytype_aval_mappings[cls] = lambda x: core.typeof(x.raw)


# ------------------------------------------------------------------- autodiff under vmap


def is_batched(x: Any) -> bool:
    """Whether the traced value `x` carries a `jax.vmap` batch dimension (per-example values).

    Walks the tracer chain of `x`: `grad`'s JVP/linearize tracers keep the primal in
    `.primal`, `vmap`'s `BatchTracer` keeps the per-example value in `.val` and its mapped
    dimension in `.batch_dim` (None / `not_mapped` when unbatched). Same attribute names in jax
    0.10.2 and 0.12 (the tracer classes are internal; only attributes are read).
    """
    seen = 0
    while isinstance(x, _Tracer) and seen < 64:
        seen += 1
        if hasattr(x, "batch_dim"):
            bd = x.batch_dim
            if bd is not None:  # not_mapped is None (0.10 and 0.12)
                return True
            x = getattr(x, "val", None)
            continue
        nxt = getattr(x, "primal", None)
        if nxt is None or nxt is x:
            return False
        x = nxt
    return False


def custom_vjp_rules(fn: Any) -> tuple[Any, Any, Any] | None:
    """(primal function, fwd, bwd) of a `jax.custom_vjp` function whose rules are defined and
    that has no `nondiff_argnums`; None for anything else. `jax.custom_vjp` and its `fun`,
    `fwd`, `bwd`, `nondiff_argnums` attributes are public in 0.10 and 0.12."""
    if not isinstance(fn, jax.custom_vjp):
        return None
    fwd, bwd = getattr(fn, "fwd", None), getattr(fn, "bwd", None)
    if fwd is None or bwd is None or getattr(fn, "nondiff_argnums", ()):
        return None
    return fn.fun, fwd, bwd


def scan_counts(eqn: Any) -> tuple[int, int]:
    """(loop constants, carries) of a `scan` equation: [0.10] `num_consts` / `num_carry`;
    [0.12] `ft_in` = (consts, carry, xs), an `FTTuple` (`.elts`) or, transposed, `FTPyTree`."""
    p, ft = eqn.params, eqn.params.get("ft_in")
    if ft is None:
        return int(p["num_consts"]), int(p["num_carry"])
    if hasattr(ft, "elts"):
        return len(ft.elts[0].vals), len(ft.elts[1].vals)
    return ft.tree.children()[0].num_leaves, ft.tree.children()[1].num_leaves


def is_differentiated(x: Any) -> bool:
    """Whether `x` is being differentiated where it is used: a JVP or linearize tracer (of
    `jax.grad`/`jax.vjp`/`jax.jvp`) in its tracer chain. A value staged by `jax.jit` is not
    (it may be differentiated later, outside: not visible here). The tracer classes are
    internal in jax 0.10.2 and 0.12; only their names and `.primal`/`.val` are read."""
    seen = 0
    while isinstance(x, _Tracer) and seen < 64:
        seen += 1
        if type(x).__name__ in ("JVPTracer", "LinearizeTracer"):
            return True
        nxt = getattr(x, "primal", None)
        if nxt is None:
            nxt = getattr(x, "val", None)
        if nxt is None or nxt is x:
            return False
        x = nxt
    return False


# ------------------------------------------------------------------- jax.grad of a typed loss


def hook_grad_vjp(make: Any) -> None:
    """Replace the `vjp` that `jax.grad` / `jax.value_and_grad` call by `make(vjp)`, once.

    jax 0.10.2 and 0.12: `value_and_grad_f` (jax/_src/api.py; `jax.grad` calls it too, and so
    do `eqx.filter_grad` / `eqx.filter_value_and_grad` through `jax.value_and_grad`) looks up
    the module-global `vjp` at each call, then seeds `vjp_py(_one_vjp(ans))` with a *raw*
    cotangent, which cannot match the structure of a typed loss (a pytree node). The public
    `jax.vjp` is a separate binding and stays JAX's own. `make(vjp)` must pass every call it
    does not handle to `vjp` unchanged."""
    from jax._src import api

    if getattr(api.vjp, "_spmdtyped_grad_hook", False):
        return
    hooked = make(api.vjp)
    hooked._spmdtyped_grad_hook = True
    api.vjp = hooked


#: (module, function qualname) of the public entry points above `value_and_grad_f`
_GRAD_ENTRIES = {("jax._src.api", "grad.<locals>.grad_f"): "jax.grad",
                 ("jax._src.api", "grad.<locals>.grad_f_aux"): "jax.grad",
                 ("equinox._ad", "_GradWrapper.__call__"): "eqx.filter_grad",
                 ("equinox._ad", "_ValueAndGradWrapper.__call__"): "eqx.filter_value_and_grad"}


def grad_call_site(depth: int) -> tuple[str, Any] | None:
    """`(name, argnums)` when the frame `depth` levels up is JAX's `value_and_grad_f` (jax
    0.10.2 and 0.12: the closure of `jax.value_and_grad`, with `argnums` among its free
    variables); `name` is the public function the user called (`jax.grad`,
    `jax.value_and_grad`, `eqx.filter_grad`, ...). None for any other caller of `vjp`."""
    f = sys._getframe(depth + 1)
    if f.f_code.co_name != "value_and_grad_f" or f.f_globals.get("__name__") != "jax._src.api":
        return None
    argnums = f.f_locals.get("argnums", 0)
    name, g, hops = "jax.value_and_grad", f.f_back, 0
    while g is not None and hops < 8:
        if g.f_code.co_name == "value_and_grad_f":
            break  # an enclosing jax.grad's frames
        entry = _GRAD_ENTRIES.get((g.f_globals.get("__name__", ""),
                                   getattr(g.f_code, "co_qualname", g.f_code.co_name)))
        if entry is not None:
            # eqx.filter_grad calls eqx.filter_value_and_grad's wrapper: the outermost wins
            name = entry
        hops += 1
        g = g.f_back
    return name, argnums
