"""THE collective table: one `Collective` row per collective or cast (`st.psum` ... `st.pcast`).

A row holds every fact about its collective that more than one place needs: the public name,
JAX's signature after `(x, axis_name)` (`Param`s: argument order, keyword-only, defaults, the
annotation the static view and the stub write), the rule (`AXIS_OPS` keys, `op(to)` when a
`to=` keyword picks one), the JAX function and how the runtime binds it, the refinement kind,
and the jaxpr primitive names JAX binds for it. The readers iterate the rows:

- `_ops/collectives.py` makes `st.<name>` from each row (`make`); `spmdtyped.lax` makes its
  checked drop-ins the same way; `spmdtyped.__getattr__` serves both;
- `_stubgen/forms.py` renders each row's overloads (its parameters from `params`);
- `_mypy/collectives.py` dispatches on `collective(name)` at hook time;
- the jaxpr walk (`_engine/walk.py`, `refine_walk.py`) maps primitives with `axis_primitive`;
- `tests/test_collective_row.py` checks `_static.py`'s declarations against the rows (type
  checkers cannot iterate a table) and that a row registered in a test (`registered`) is seen
  by all of them.

Adding a collective: its row here; its `AXIS_OPS` row in `_rules/axis_ops.py` if no existing
rule fits (and, if its refinement is new, its case in `_rules/refine/shape.py`'s `collective`);
the declarations type checkers read, which cannot come from a table at check time:
`_static.py` (overloads + `__all__`) and `spmdtyped.lax`'s `TYPE_CHECKING` block (when
`in_lax`), both checked against the row by `tests/test_collective_row.py`, whose failure
prints the declaration to paste; and its tests.

Plain data: imports no JAX (the mypy plugin reads it), only `_rules`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
from collections.abc import Callable, Iterator, Mapping

from .._rules.axis_ops import ALL_GATHER_TARGETS, AXIS_OPS, PCAST_TARGETS, all_gather_op, pcast_op


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: the default of a parameter that has none
REQUIRED: object = _Required()


@dataclasses.dataclass(frozen=True)
class Param:
    """A parameter after `(x, axis_name)`, as JAX spells it.

    - `annotation`: the type the static view (`_static.py`) and the stub write.
    - `default`: a Python literal, or `REQUIRED`.
    - `keyword`: keyword-only (after `*`).
    - `refine`: the refinement reads it (passed to `refine_shape.collective(params=)`, read
      from literal arguments by the plugin).
    """

    name: str
    annotation: str
    default: object = REQUIRED
    keyword: bool = False
    refine: bool = False

    def text(self) -> str:
        """`name: annotation = default`, as the static view writes it."""
        default = "" if self.default is REQUIRED else f" = {_literal(self.default)}"
        return f"{self.name}: {self.annotation}{default}"


def _literal(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


@dataclasses.dataclass(frozen=True, eq=False)  # compared and hashed by identity
class Collective:
    """A collective or cast.

    - `name`: `st.<name>` (and `spmdtyped.lax.<name>` when `in_lax`).
    - `ops`: the `AXIS_OPS` rows it applies; several when the `to=` keyword picks one
      (`select(to, label)`, the `to=` values in `targets`). Empty: `axis_index` / `axis_size`,
      which take no value (their runtime functions are written by hand in `_ops/collectives`).
    - `jax`: JAX's function, dotted (`jax.lax.psum`).
    - `params`: the parameters after `(x, axis_name)`.
    - `bind`: the dotted callable the typed runtime binds instead of `jax` (same signature as
      JAX's), where binding needs more than JAX's function (`pbroadcast` on CPU, the casts
      under `check_vma=False`); `fixed`: keywords the binding gets that the signature lacks
      (`pvary` binds `pcast(to="varying")`).
    - `tree_bind`: `spmdtyped.lax` binds a pytree of several leaves in one JAX call (a pmean
      of a tree binds all psums before the divides), after checking every leaf.
    - `primitives`: jaxpr primitive -> `AXIS_OPS` row, for the walk of a traced program
      (names are jax 0.12's; `_compat.primitive_name` maps 0.10's). An asynchronous start
      (jax 0.12: `psum_invariant_start`, ...) takes its collective's params and is its row;
      its `done` passes the value on (`_rules.primitives.ASYNC_DONES`). A collective that binds
      another's primitive (`pmean`: `psum_invariant` + `div`; `pshuffle`: `ppermute`) has none.
    - `refine`: the refinement kind (`REFINE_KINDS`): `refine_shape.collective` of the rule.
    - `check`: the dotted callable `check(raw, axis_name, args, op)` that validates the call's
      arguments against the value and the axis before binding (a permutation, a dimension in
      range and divisible over the axis): SPMD509 instead of an error from inside JAX.
    - `doc`: the docstring of `st.<name>` (`spmdtyped.lax.<name>` says it is checked and
      raw, then repeats it).
    """

    name: str
    ops: tuple[str, ...]
    jax: str
    params: tuple[Param, ...] = ()
    in_lax: bool = True
    select: Callable[[object, str], str] | None = None
    targets: tuple[str, ...] = ()
    bind: str | None = None
    fixed: Mapping[str, object] = dataclasses.field(default_factory=dict)
    tree_bind: bool = False
    primitives: Mapping[str, str] = dataclasses.field(default_factory=dict)
    refine: str = "collective"
    doc: str = ""
    check: str | None = None

    def op(self, to: object = None, label: str | None = None) -> str:
        """The `AXIS_OPS` row this call applies (`to`: the `to=` argument, where it has one);
        an unknown target is the rule's error (SPMD505)."""
        if self.select is None:
            assert len(self.ops) == 1, self
            return self.ops[0]
        return self.select(to, label or f"st.{self.name}")

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def signature(self) -> str:
        """`(x, axis_name, ...)` as the static view writes it (annotations of `x` and
        `axis_name` left out)."""
        parts = ["x"] if self.ops else []
        parts.append("axis_name")
        star = False
        for p in self.params:
            if p.keyword and not star:
                parts.append("*")
                star = True
            parts.append(p.text())
        return f"({', '.join(parts)})"


_GROUPS = Param("axis_index_groups", "None", None, keyword=True)
_TILED = Param("tiled", "bool", False, keyword=True, refine=True)

_BUILTIN: tuple[Collective, ...] = (
    Collective("psum", ("psum",), "jax.lax.psum", (_GROUPS,), tree_bind=True,
               primitives={"psum_invariant": "psum", "psum": "psum", "unreduced_psum": "psum",
                           "psum_invariant_start": "psum"},
               doc="Typed `jax.lax.psum`: Varying or Unreduced on the named axes -> Invariant "
                   "there.\n\n**Arguments:** as `jax.lax.psum`; `x` is a typed or raw value or a "
                   "pytree of them.\n\n**Returns:** typed values, Invariant on `axis_name`, "
                   "other axes unchanged (`st.psum` of a raw value is typed too).\n\n**Raises:** `AxisStateError` SPMD101 (Reduced input), SPMD103 "
                   "(already Invariant: a double sum), SPMD104 (mixed states over a tuple of "
                   "axes); `UsageError` for bad axis names.\n\n!!! Example\n    ```python\n"
                   "    y = st.psum(x, \"tp\")   # Varying[\"dp\", \"tp\"] -> Varying[\"dp\"]\n"
                   "    ```"),
    Collective("pmean", ("pmean",), "jax.lax.pmean", (_GROUPS,), tree_bind=True,
               doc="Typed `jax.lax.pmean` (Varying or Unreduced -> Invariant); see `psum` (a "
                   "pmean of already-summed gradients is SPMD103)."),
    Collective("pmax", ("pmax",), "jax.lax.pmax", (_GROUPS,), tree_bind=True,
               primitives={"pmax": "pmax", "unreduced_pmax": "pmax"},
               doc="Typed `jax.lax.pmax` (Varying -> Invariant; Unreduced of kind max on jax "
                   "0.12)."),
    Collective("pmin", ("pmin",), "jax.lax.pmin", (_GROUPS,), tree_bind=True,
               primitives={"pmin": "pmin", "unreduced_pmin": "pmin"},
               doc="Typed `jax.lax.pmin` (Varying -> Invariant; Unreduced of kind min on jax "
                   "0.12)."),
    Collective("ppermute", ("ppermute",), "jax.lax.ppermute",
               (Param("perm", "Sequence[tuple[int, int]]"),), tree_bind=True,
               primitives={"ppermute": "ppermute", "ppermute_start": "ppermute"},
               check="spmdtyped._ops.collectives.check_perm",
               doc="Typed `jax.lax.ppermute`: Varying -> Varying (send shard `src` to device "
                   "`dst`). A replicated (Invariant) input is SPMD103: JAX would pvary it and "
                   "send identical copies."),
    Collective("pshuffle", ("pshuffle",), "jax.lax.pshuffle", (Param("perm", "Sequence[int]"),),
               check="spmdtyped._ops.collectives.check_shuffle",
               doc="Typed `jax.lax.pshuffle`: Varying -> Varying (binds `ppermute`)."),
    Collective("pbroadcast", ("pbroadcast",), "jax.lax.pbroadcast", (Param("source", "int"),),
               bind="spmdtyped._compat.pbroadcast", primitives={"pbroadcast": "pbroadcast"},
               doc="Typed `jax.lax.pbroadcast`: Varying -> Varying (JAX types the result "
                   "Varying). JAX has no CPU lowering for pbroadcast; on CPU the equivalent "
                   "masked psum is bound."),
    Collective("all_gather", ("all_gather", "all_gather_invarying", "all_gather_reduced"),
               "jax.lax.all_gather",
               (_GROUPS, Param("axis", "int", 0, keyword=True, refine=True), _TILED,
                Param("to", "str", "varying", keyword=True)), check="spmdtyped._ops.collectives.check_gather",
               select=lambda to, _op: all_gather_op(to), targets=ALL_GATHER_TARGETS,
               bind="spmdtyped._ops.collectives.bind_all_gather",
               primitives={"all_gather": "all_gather", "all_gather_invariant":
                           "all_gather_invarying", "all_gather_reduced": "all_gather_reduced",
                           "all_gather_start": "all_gather",
                           "all_gather_reduced_start": "all_gather_reduced"},
               doc="Typed `jax.lax.all_gather`. `to=\"varying\"` (default): Varying -> Varying; "
                   "`to=\"invarying\"`: Varying -> Invariant; `to=\"reduced\"`: Varying -> "
                   "Reduced (the ZeRO/FSDP parameter gather: its gradient is Unreduced and is "
                   "reduced with `psum_scatter`)."),
    Collective("psum_scatter", ("psum_scatter",), "jax.lax.psum_scatter",
               (Param("scatter_dimension", "int", 0, keyword=True, refine=True), _GROUPS, _TILED),
               check="spmdtyped._ops.collectives.check_scatter",
               primitives={"reduce_scatter": "psum_scatter",
                           "unreduced_reduce_scatter": "psum_scatter",
                           "reduce_scatter_start": "psum_scatter"},
               doc="Typed `jax.lax.psum_scatter`: Varying or Unreduced -> Varying (summed, "
                   "scattered)."),
    Collective("all_to_all", ("all_to_all",), "jax.lax.all_to_all",
               (Param("split_axis", "int", refine=True), Param("concat_axis", "int", refine=True),
                _GROUPS, _TILED),
               primitives={"all_to_all": "all_to_all", "all_to_all_start": "all_to_all"},
               check="spmdtyped._ops.collectives.check_all_to_all",
               doc="Typed `jax.lax.all_to_all`: Varying -> Varying."),
    Collective("pcast", ("pcast_varying", "pcast_reduced", "pcast_unreduced"), "jax.lax.pcast",
               (Param("to", "str", keyword=True),), select=pcast_op, targets=PCAST_TARGETS,
               bind="spmdtyped._ops.collectives.bind_cast",
               primitives={"preduced": "pcast_reduced", "vary_unreduced_cast": "pcast_unreduced",
                           "reduced_vary_cast": "pcast_varying"},
               doc="Typed `jax.lax.pcast`: the free casts I->V, R->V (`to=\"varying\"`), I->R "
                   "(`\"reduced\"`), V->U (`\"unreduced\"`); anything else is SPMD301. Python "
                   "scalars are accepted (cast through `jnp.asarray`)."),
    # st.pvary: the old spelling of pcast(to="varying"); spmdtyped.lax has pcast only
    Collective("pvary", ("pvary",), "jax.lax.pcast", in_lax=False,
               bind="spmdtyped._ops.collectives.bind_cast", fixed={"to": "varying"},
               primitives={"pvary": "pvary"},
               doc="Invariant -> Varying on the named axes (a free cast: "
                   "`jax.lax.pcast(to=\"varying\")`)."),
    Collective("axis_index", (), "jax.lax.axis_index",
               doc="Typed `jax.lax.axis_index`: an int32 scalar, Varying on the named axes."),
    Collective("axis_size", (), "jax.lax.axis_size",
               doc="`jax.lax.axis_size`: the number of devices along the named axes (a Python "
                   "int that remembers its axes)."),
)

#: the live table: the built-in rows, plus rows a test registers (`registered`)
_TABLE: dict[str, Collective] = {c.name: c for c in _BUILTIN}
#: the built-in rows, in table order (`all_collectives()` includes registered ones)
COLLECTIVES: tuple[Collective, ...] = _BUILTIN
#: every public collective/cast name (`st.<name>`) of the built-in rows, in table order
COLLECTIVE_NAMES: tuple[str, ...] = tuple(c.name for c in COLLECTIVES)
#: the names `spmdtyped.lax` checks
LAX_NAMES: tuple[str, ...] = tuple(c.name for c in COLLECTIVES if c.in_lax)
#: collectives that take a typed value and apply an `AXIS_OPS` row (not axis_index/axis_size)
TYPED_COLLECTIVES: tuple[str, ...] = tuple(c.name for c in COLLECTIVES if c.ops)


def all_collectives() -> tuple[Collective, ...]:
    """Every row, registered ones included, in table order."""
    return tuple(_TABLE.values())


def collective(name: str) -> Collective | None:
    """The collective/cast `st.<name>`, or None."""
    return _TABLE.get(name)


def _primitives() -> dict[str, str]:
    out: dict[str, str] = {}
    for c in _TABLE.values():
        for prim, op in c.primitives.items():
            assert out.get(prim, op) == op, (prim, c.name)
            out[prim] = op
    return out


_PRIMS: dict[str, str] = _primitives()
#: jaxpr primitive -> `AXIS_OPS` row, of every row (a live view: registered rows included)
AXIS_PRIMITIVES: Mapping[str, str] = types.MappingProxyType(_PRIMS)


def axis_primitive(name: str) -> str | None:
    """The `AXIS_OPS` row of a collective/cast primitive in a jaxpr, or None."""
    return _PRIMS.get(name)


def check(c: Collective) -> None:
    """A row is well formed: its rules exist, its `to=` targets pick its rules, its
    primitives map to its rules."""
    unknown = [op for op in c.ops if op not in AXIS_OPS]
    assert not unknown, f"collective {c.name!r} names unknown AXIS_OPS rows {unknown}"
    assert bool(c.select) == bool(c.targets), c.name
    if c.select is not None:
        assert {c.op(t) for t in c.targets} == set(c.ops), c.name
        assert c.param("to") is not None, f"collective {c.name!r}: select without a to= param"
    bad = sorted(set(c.primitives.values()) - set(c.ops))
    assert not bad, f"collective {c.name!r}: primitives map to rows it does not apply: {bad}"
    names = [p.name for p in c.params]
    assert len(set(names)) == len(names) and not {"x", "axis_name"} & set(names), c.name


@contextlib.contextmanager
def registered(*rows: Collective) -> Iterator[tuple[Collective, ...]]:
    """Add rows to the table for the duration of the block (tests: a row is all it takes),
    then remove them. A name already in the table is an error."""
    for c in rows:
        check(c)
        assert c.name not in _TABLE, f"collective {c.name!r} exists"
    try:
        for c in rows:
            _TABLE[c.name] = c
        _PRIMS.clear()
        _PRIMS.update(_primitives())
        yield rows
    finally:
        for c in rows:
            _TABLE.pop(c.name, None)
        _PRIMS.clear()
        _PRIMS.update(_primitives())


def _check() -> None:
    for c in _BUILTIN:
        check(c)
    axis = {op for c in _BUILTIN for op in c.ops}
    assert axis == set(AXIS_OPS), sorted(axis ^ set(AXIS_OPS))


_check()
