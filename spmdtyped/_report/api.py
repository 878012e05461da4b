"""`st.report(step, *args, **kwargs)`: every collective of a step, traced and compiled.

One `jax.jit(step).trace(*args)` gives the jaxpr (walked by `traced`) and, when the mesh has
devices, the compiled program (read by `hlo`); the two are matched collective by collective
(kind, axes, bytes of one execution; the phase breaks ties), which gives each compiled op the
origin of its JAX equation, or `compiler` when nothing in the jaxpr asked for it, and lists
the traced collectives the compiler removed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

from .. import _compat
from .._engine import walk as _walk
from . import flags as _flags
from . import hlo, render
from .flags import Flag
from .hlo import CompiledOp
from .progress import Progress
from .traced import Collective, TracedWalk

#: what one byte of a collective's result costs on the wire per device, for a group of n
#: (ring algorithms): the "wire" column of the table
WIRE = {"all-reduce": lambda n: 2 * (n - 1) / n, "all-gather": lambda n: (n - 1) / n,
        "reduce-scatter": lambda n: float(n - 1), "collective-permute": lambda n: 1.0,
        "all-to-all": lambda n: (n - 1) / n}


def _where(frames: list[tuple[str, int, str]]) -> str | None:
    f = _walk.user_frame(frames)
    return f"{f[0]}:{f[1]}" if f else None


@dataclasses.dataclass
class Report:
    """The communication of one step. `collectives`: from the traced program (forward and
    backward); `compiled`: what the compiled program runs (empty for an abstract mesh);
    `removed`: traced collectives with no compiled counterpart; `flags`: SPMD7xx findings."""

    collectives: list[Collective]
    compiled: list[CompiledOp]
    removed: list[tuple[Collective, int]]
    flags: list[Flag]
    mesh: dict[str, int]
    #: True when the compiled program was read
    was_compiled: bool = False
    #: loops whose trip count could not be read (their collectives are counted once)
    unknown_trips: list[str | None] = dataclasses.field(default_factory=list)
    equations: int = 0

    # -- numbers
    def totals(self, source: str = "traced") -> dict[str, dict[str, int]]:
        """Bytes per step per device: `{"axes": {"dp": ..., "dp+tp": ...}, "kinds": {...}}`,
        from the traced collectives or (`source="compiled"`) the compiled ones."""
        items: Sequence[Any] = self.collectives if source == "traced" else self.compiled
        axes: dict[str, int] = {}
        kinds: dict[str, int] = {}
        for c in items:
            key = "+".join(c.axes or ("?",))
            axes[key] = axes.get(key, 0) + c.bytes
            kinds[c.kind] = kinds.get(c.kind, 0) + c.bytes
        return {"axes": axes, "kinds": kinds}

    def summary(self, source: str = "traced", by_phase: bool = False
                ) -> dict[tuple[Any, ...], tuple[int, int]]:
        """(kind, axes[, phase]) -> (count, bytes) of the traced or compiled collectives."""
        items: Sequence[Any] = self.collectives if source == "traced" else self.compiled
        out: dict[tuple[Any, ...], tuple[int, int]] = {}
        for c in items:
            key = (c.kind, tuple(c.axes or ()), *((c.phase,) if by_phase else ()))
            n, b = out.get(key, (0, 0))
            out[key] = (n + c.count, b + c.bytes)
        return out

    def wire_bytes(self, c: Collective | CompiledOp) -> float:
        n = 1
        for a in c.axes or ():
            n *= self.mesh.get(a, 1)
        return WIRE[c.kind](n) * c.bytes if n > 1 else 0.0

    def added(self) -> list[CompiledOp]:
        """Compiled collectives nothing in the traced program asked for."""
        return [op for op in self.compiled if op.origin == "compiler"]

    def differences(self) -> list[str]:
        """What the compiler changed, one sentence each."""
        out = [f"removed by the compiler: {c.kind} over {'+'.join(c.axes)} x{n} "
               f"({c.unit_bytes} B each) at {c.where} ({c.primitive}, {c.phase})"
               for c, n in self.removed]
        out += [f"added by the compiler: {op.kind} over {'+'.join(op.axes or ('?',))} "
                f"x{op.count} ({op.unit_bytes} B each) for {op.primitive} at {op.where}"
                for op in self.added()]
        merged = [op for op in self.compiled if op.combined > 1]
        if merged:
            out.append(f"combined by the compiler: {len(merged)} collectives run as operands "
                       "of tuple ops (same bytes, fewer launches)")
        return out

    def check(self) -> None:
        """Raise the first flag as a `CommunicationError` (for a CI job); nothing if none."""
        from .._errors import error

        if self.flags:
            f = self.flags[0]
            e = error(f.code, f"st.report: {f.message}", axes=f.axes, fix=f.fix, op="st.report",
                      details=[f"at {f.where}"] if f.where else ())
            raise e

    # -- output
    def to_json(self) -> dict[str, Any]:
        compiled: dict[tuple[Any, ...], list[int]] = {}
        for op in self.compiled:
            key = (op.kind, tuple(op.axes or ()), op.origin)
            acc = compiled.setdefault(key, [0, 0])
            acc[0] += op.count
            acc[1] += op.bytes
        return {
            "collectives": [c.to_json() for c in self.collectives],
            "compiled": [{"kind": k, "axes": list(a), "count": n, "bytes": b, "origin": o}
                         for (k, a, o), (n, b) in compiled.items()],
            "flags": [f.to_json() for f in self.flags],
        }

    def table(self, width: int = 100) -> str:
        """The terminal table: per axis group, collectives sorted by bytes."""
        return render.table(self, width)

    def html(self) -> str:
        """A self-contained HTML page: bar charts of bytes per axis and per line."""
        return render.html(self)

    def __str__(self) -> str:
        return self.table()


def _mesh_of(walk: TracedWalk, args: Sequence[Any]) -> Any:
    """The step's mesh: a shard_map's, an argument sharding's or `jax.set_mesh`'s, the first
    one with devices (a shard_map under `jax.set_mesh` holds only the abstract mesh, its
    arguments the concrete one); an abstract mesh when none has devices."""
    found = [sm.params.get("mesh") for sm in walk.shard_maps]
    found += [getattr(getattr(a, "sharding", None), "mesh", None)
              for a in jax.tree_util.tree_leaves(args)]
    found.append(_compat.context_mesh(concrete=True))
    found = [m for m in found if m is not None]
    return next((m for m in found if _has_devices(m)), found[0] if found else None)


def _has_devices(mesh: Any) -> bool:
    try:
        return mesh is not None and getattr(mesh, "devices", None) is not None \
            and len(mesh.devices.flat) > 0
    except (AttributeError, ValueError, TypeError):
        return False


def match(traced: Sequence[Collective], compiled: Sequence[CompiledOp]
          ) -> tuple[list[CompiledOp], list[tuple[Collective, int]]]:
    """Give each compiled op the origin of the traced collective it runs (same kind, axes
    and bytes; the same phase first); split off what matches nothing (`origin="compiler"`).
    Returns the compiled ops and the traced collectives left over (with their counts)."""
    left = {id(c): c.count for c in traced}
    out: list[CompiledOp] = []
    for op in compiled:
        need = op.count
        cands = [c for c in traced if c.kind == op.kind and tuple(c.axes) == tuple(op.axes or ())
                 and c.unit_bytes == op.unit_bytes and left[id(c)] > 0]
        cands.sort(key=lambda c: (c.phase != op.phase, c.primitive != op.primitive))
        origin = None
        for c in cands:
            take = min(need, left[id(c)])
            left[id(c)] -= take
            need -= take
            origin = origin or c.origin
            if need == 0:
                break
        if need < op.count:
            out.append(dataclasses.replace(op, count=op.count - need, origin=origin or "user"))
        if need:
            out.append(dataclasses.replace(op, count=need, origin="compiler"))
    removed = [(c, left[id(c)]) for c in traced if left[id(c)] > 0]
    return out, removed


def report(fn: Callable[..., Any], /, *args: Any, compile: bool | None = None,
           progress: bool | None = False, **kwargs: Any) -> Report:
    """Every collective of a step, forward and backward, against the compiled program.

    **Arguments:**

    - `fn`: the step, jitted or not (`st.shard_map`, `jax.shard_map` or Explicit-mode code).
    - `*args`, `**kwargs`: its arguments: arrays or `jax.ShapeDtypeStruct`s (with a
      `sharding` on a `Mesh` or an `AbstractMesh`).
    - `compile`: read the compiled program too (default: when the mesh has devices).
    - `progress`: write each phase (trace, walk, lower, compile, parse HLO, match, flags)
      with its count and time to stderr; `None`: when stderr is a terminal; off by default.

    **Returns:** a `Report`: `.collectives` (kind in the compiled program's op names, mesh
    axes, count per step with loop trip counts multiplied, bytes per device and per step,
    phase, origin `user` / `autodiff` / `jax`, the user's `file:line`), `.compiled` (what runs,
    origin `compiler` for what only the compiler added), `.flags` (SPMD7xx), `.totals()`,
    `.to_json()`, `.table()`, `.html()`; `.check()` raises the first flag.

    !!! Example

        ```python
        rep = st.report(jax.jit(step), params, batch)
        print(rep.table())
        rep.to_json()["collectives"][0]   # {"kind": "all-reduce", "axes": ["dp"], ...}
        ```
    """
    show = Progress(progress)
    with show.phase("trace"):
        traced = jax.jit(fn).trace(*args, **kwargs)
    closed = traced.jaxpr
    with show.phase("walk") as note:
        walk = TracedWalk().run(closed)
        mesh = _mesh_of(walk, args)
        sizes = dict(getattr(mesh, "shape", {}) or {}) if mesh is not None else {}
        if any(c.group is None for c in walk.collectives) and sizes:
            walk = TracedWalk().run(closed, sizes)
        note += [f"{walk.equations} equations", f"{len(walk.collectives)} collectives"]
    do_compile = _has_devices(mesh) if compile is None else compile
    ops: list[CompiledOp] = []
    removed: list[tuple[Collective, int]] = []
    if do_compile:
        with show.phase("lower"):
            lowered = traced.lower()
        with show.phase("compile") as note:
            text = lowered.compile().as_text()
            note.append(f"{text.count(chr(10)) + 1} lines of HLO")
        with show.phase("parse HLO") as note:
            names = tuple(sizes)
            ops = hlo.parse(text, names, tuple(sizes[a] for a in names), _where)
            note.append(f"{len(ops)} collectives")
        with show.phase("match") as note:
            ops, removed = match(walk.collectives, ops)
            note += [f"{sum(op.origin == 'compiler' for op in ops)} added",
                     f"{len(removed)} removed"]
    with show.phase("flags") as note:
        flags = _flags.all_flags(walk.collectives, ops, walk.shard_maps, walk.parents)
        note.append(f"{len(flags)} flags")
    show.done(f"{len(walk.collectives)} collectives" + (f", {len(ops)} compiled" if do_compile
                                                          else ""))
    return Report(walk.collectives, ops, removed, flags, sizes, do_compile, walk.unknown_trips,
                  walk.equations)
