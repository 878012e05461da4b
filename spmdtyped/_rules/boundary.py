"""The shard_map boundary (reference §4): in_spec -> state, the out_spec check, the
full-manual rule, and THE hint renderer (state -> annotation text such as `Varying["dp"]`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .._errors import error
from .caching import hashable_cache
from .states import I, R, SpmdType, U, V


def in_spec_type(partitioned: Iterable[str], unreduced: Iterable[str] = (), reduced: Iterable[str] = (),
                 manual: Iterable[str] | None = None, unreduced_kind: str | None = None) -> SpmdType:
    """The state an argument has inside shard_map, from its in_spec's axes."""
    m = None if manual is None else frozenset(manual)

    def keep(s: Iterable[str]) -> frozenset[str]:
        return frozenset(s) if m is None else frozenset(s) & m

    return SpmdType(keep(partitioned), keep(unreduced), keep(reduced),
                    unreduced_kind if keep(unreduced) else None)


def check_out_spec(t: SpmdType, partitioned: Iterable[str], unreduced: Iterable[str],
                   reduced: Iterable[str], manual: Sequence[str], *, where: str,
                   spec: str) -> None:
    """SPMD401 unless an output of type `t` fits its out_spec on every manual axis."""
    part, un, red = frozenset(partitioned), frozenset(unreduced), frozenset(reduced)
    for a in manual:
        s = t.state(a)
        if a in part:
            ok, want = s in (V, I), "Varying or Invariant (partitioned)"
        elif a in un:
            ok, want = s is U, "Unreduced (out_specs unreduced=...)"
        elif a in red:
            ok, want = s is R, "Reduced (out_specs reduced=...)"
        else:
            ok, want = s is I, "Invariant (the spec does not mention the axis)"
        if not ok:
            if s is I or s is V:
                fix = (f"st.psum(y, {a!r}) to make it Invariant, or mention {a!r} in the spec"
                       if s is V else f"st.pvary(y, {a!r}) is not needed; use a partitioned spec")
            elif s is U:
                fix = f"st.psum(y, {a!r}), or out_specs with unreduced={{{a!r}}}"
            else:
                fix = f"out_specs with reduced={{{a!r}}}"
            raise error("SPMD401", f"{where}: output {spec} on axis {a!r} wants {want}, but the "
                        f"value is {s.title}", axes=(a,), states={a: s.value}, fix=fix,
                        op="st.shard_map", details=(f"value: {t}", f"out_spec: {spec}"))



def check_return(t: SpmdType, want: SpmdType, *, where: str, refinement: str | None = None,
                 hint: str | None = None) -> None:
    """SPMD401 unless a value of state `t` returned through the out boundary fits the return
    hint `want`: Varying is covariant (an Invariant value fits `Varying[...]`), Unreduced and
    Reduced exact, as `isinstance` checks a hint. `refinement`: why the value's refinement does
    not fit the hint's (`refine_shape.accepts`), when the states fit but it does not."""
    shown = hint or str(want)
    for a in sorted(t.axes | want.axes):
        s, w = t.state(a), want.state(a)
        if s is w or (s is I and w is V):
            continue
        if w is I and s in (V, U):
            fix = f"st.psum(y, {a!r}) before returning it" + (
                " (or st.all_gather / st.pmean, whichever the function means)" if s is V else "")
        elif w is V and s is U:
            fix = f"st.psum(y, {a!r}) (or st.psum_scatter) before returning it"
        elif s is R:
            fix = f"the hint {hint_text(t)}, or st.pcast(y, {a!r}, to='invariant') where the value is known replicated"
        else:
            fix = f"make the value and the return hint agree (the hint {hint_text(t)})"
        raise error("SPMD401", f"{where}: the value is {s.title} over {a!r}, but the return "
                    f"hint ({shown}) is {w.title} over {a!r}", axes=(a,), states={a: s.value},
                    fix=fix, op="return", details=(f"value: {t}", f"return hint: {shown}"))
    if refinement:
        raise error("SPMD401", f"{where}: the returned value does not fit the return hint "
                    f"{shown}: {refinement}", op="return", fix="reduce the value (st.psum) or "
                    "change the return hint to the value's refinement",
                    details=(f"value: {t}", f"return hint: {shown}"))


def check_full_manual(unreduced: Iterable[str], reduced: Iterable[str], manual: Sequence[str],
                      mesh_axes: Sequence[str], *, where: str, spec: str,
                      op: str = "st.shard_map", what: str = "in_specs") -> None:
    """SPMD403 for an in_spec (SPMD401 for an out_spec) with Unreduced/Reduced axes in a
    shard_map that is not manual over every mesh axis (reference Q15: JAX fails there with a
    bare assertion for an input, a raw NotImplementedError for an output)."""
    if len(tuple(manual)) < len(tuple(mesh_axes)) and (tuple(unreduced) or tuple(reduced)):
        code, value = ("SPMD403", "input") if what == "in_specs" else ("SPMD401", "output")
        raise error(code, f"{where}: {what} {spec} gives an Unreduced/Reduced {value}, "
                    f"which needs a full-manual shard_map (manual axes: {list(manual)})", op=op,
                    fix="drop axis_names (make every mesh axis manual)")


def check_full_manual_value(manual: Sequence[str], mesh_axes: Sequence[str], *, op: str) -> None:
    """SPMD403 for an op that makes an Unreduced/Reduced value where not every mesh axis is
    manual (reference Q15: JAX fails with a bare AssertionError on any op on such a value)."""
    if len(tuple(manual)) < len(tuple(mesh_axes)):
        raise error("SPMD403", f"{op}: Unreduced/Reduced values need a full-manual shard_map, "
                    f"but only {list(manual)} of {list(mesh_axes)} are manual here (JAX fails "
                    f"with a bare AssertionError on any op on such a value)", op=op,
                    fix="make every mesh axis manual (st.shard_map without axis_names), or keep "
                        "the value Varying")


@hashable_cache(1024)   # (read once per spec: every output leaf's check names its spec)
def spec_text(spec: object) -> str:
    """A PartitionSpec as messages show it: `P('dp', None)`, `P()` for None."""
    return "P()" if spec is None else repr(spec).replace("PartitionSpec", "P")


#: the hint families in the order a `Typed[...]` lists them
HINT_FAMILIES = ("Varying", "Unreduced", "Reduced")


def hint_text(t: SpmdType, order: Sequence[str] | None = None, *, quote: str = '"',
              prefix: str = "") -> str:
    """The annotation for a state as source text: `Varying["dp", "tp"]`, `Invariant`,
    `Typed[Varying["dp"], Reduced["tp"]]`. Axes in `order` (mesh order) first, the rest
    sorted; `prefix` qualifies the names (`"st."`)."""
    def axes(s: frozenset[str]) -> str:
        names = [a for a in order if a in s] if order else []
        names += sorted(s - set(names))
        return ", ".join(f"{quote}{a}{quote}" for a in names)

    parts = [f"{prefix}{label}[{axes(s)}]"
             for label, s in zip(HINT_FAMILIES, (t.varying, t.unreduced, t.reduced), strict=True) if s]
    if not parts:
        return f"{prefix}Invariant"
    return parts[0] if len(parts) == 1 else f"{prefix}Typed[{', '.join(parts)}]"
