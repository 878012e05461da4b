"""The collectives of a compiled program, read from its HLO text (`compiled.as_text()`).

Pure text work, no JAX: the computations and their call graph (a `while` body runs its
`known_trip_count` times when XLA wrote one), every `all-reduce` / `all-gather` /
`reduce-scatter` / `collective-permute` / `all-to-all` (and their `-start` async halves) with
the bytes of its result, its device groups turned back into mesh axes, and the JAX equation
it came from (`metadata={op_name=...}`: the name stack and primitive; `stack_frame_id`: the
Python line). A tuple all-reduce that XLA's combiner made from several JAX psums is split
back into one entry per operand (`combined` says how many it merged).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_DTYPE_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2,
                "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8,
                "c64": 8, "c128": 16}
_OP = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.+?)\s+"
                 r"(?P<op>" + "|".join(KINDS) + r")(?P<start>-start)?\(")
_ARRAY = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")
_COMP = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*(?:\(.*\))?\s*->.*\{\s*$")
_CALLEE = re.compile(r"\b(body|condition|to_apply|calls|true_computation|false_computation)"
                     r"=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)"?')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")


@dataclasses.dataclass
class CompiledOp:
    """One collective the compiled program runs (one operand of a combined tuple op)."""

    kind: str
    axes: tuple[str, ...] | None
    count: int
    unit_bytes: int
    #: the JAX primitive named in the metadata (`psum_invariant`, ...), or None
    primitive: str | None
    phase: str
    where: str | None
    #: how many JAX collectives XLA merged into the op this operand belongs to
    combined: int = 1
    #: filled by the comparison: the origin of the traced collective it matches, or "compiler"
    origin: str = "compiler"
    #: True when it sits in a while loop whose trip count XLA did not write down
    unknown_trip: bool = False
    #: the target of the custom call (an opaque kernel, a callback) that consumes it, if any
    feeds_kernel: str | None = None

    @property
    def bytes(self) -> int:
        return self.unit_bytes * self.count


def shape_bytes(text: str) -> list[int]:
    """Bytes of each array in an HLO shape (`f32[8,16]{1,0}` or a tuple of them)."""
    return [math.prod(int(d) for d in dims.split(",") if d) * _DTYPE_BYTES.get(dt, 4)
            for dt, dims in _ARRAY.findall(text) if dt in _DTYPE_BYTES]


def _groups(line: str) -> list[list[int]] | None:
    """The device groups of a collective: explicit `{{0,1},{2,3}}`, the iota form
    `[2,4]<=[8]` / `[4,2]<=[2,4]T(1,0)`, or the source-target pairs of a permute."""
    m = re.search(r"source_target_pairs=\{(.*?)\}\}", line)
    if m:
        return [[int(x) for x in p.split(",")] for p in re.findall(r"\{(\d+,\d+)", m.group(0))]
    m = re.search(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(([^)]*\)?)\))?"
                  r"\s*\{([^}]*)\}", line)
    if m:  # the mesh form: mesh['axis_0'=2,'axis_1'=4] {'axis_0'}, with the devices in
        # mesh order given as an iota when they are not 0..n-1: device_ids=([2,4]T(1,0))
        import numpy as np

        dims = re.findall(r"'?([\w.]+)'?\s*=\s*(\d+)", m.group(1))
        names_ = [d for d, _ in dims]
        picked = [names_.index(a) for a in re.findall(r"'?([\w.]+)'?", m.group(3))
                  if a in names_]
        shape_ = [int(n) for _, n in dims]
        ids = np.arange(math.prod(shape_))
        it = re.match(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", m.group(2) or "")
        if it:
            ids = ids.reshape([int(x) for x in it.group(1).split(",")])
            if it.group(2):
                ids = ids.transpose([int(x) for x in it.group(2).split(",")])
        ids = ids.reshape(shape_)
        rest = [k for k in range(len(dims)) if k not in picked]
        ids = ids.transpose(rest + picked)
        size = math.prod(int(dims[k][1]) for k in picked)
        return [list(map(int, g)) for g in ids.reshape(-1, size)]
    m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if m:
        import numpy as np  # only for the iota form

        shape = [int(x) for x in m.group(1).split(",")]
        dims = [int(x) for x in m.group(2).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if m.group(3):
            ids = ids.transpose([int(x) for x in m.group(3).split(",")])
        return [list(map(int, g)) for g in ids.reshape(shape[0], -1)]
    m = re.search(r"replica_groups=\{(.*?)\}(?:,|\s|$)", line)
    if m:
        inner = re.findall(r"\{([\d,]*)\}", m.group(0))
        groups = [[int(x) for x in g.split(",") if x] for g in inner]
        return [g for g in groups if g] or None
    return None


def groups_to_axes(groups: list[list[int]] | None, names: Sequence[str],
                   sizes: Sequence[int], permute: bool = False) -> tuple[str, ...] | None:
    """The mesh axes along which the devices of a group differ (device id = the flat index of
    its mesh position); for a permute, along which a source and its target differ. `()` for
    groups of one device; None when the groups name no device of the mesh."""
    n = math.prod(sizes)
    if not groups:
        return tuple(names) if n > 1 else ()

    def coords(i: int) -> tuple[int, ...]:
        out = []
        for s in reversed(sizes):
            out.append(i % s)
            i //= s
        return tuple(reversed(out))

    varying: set[int] = set()
    for g in groups:
        if any(i >= n for i in g):
            return None
        pairs = [tuple(g)] if permute else list(itertools.combinations(g, 2))
        for a, b in pairs:
            ca, cb = coords(a), coords(b)
            varying |= {k for k in range(len(sizes)) if ca[k] != cb[k]}
    return tuple(names[k] for k in sorted(varying))


def _metadata(line: str) -> tuple[list[tuple[str | None, str]], int | None]:
    """[(primitive, phase)] per operand from `op_name`, and the stack frame id."""
    m = _OP_NAME.search(line)
    frame = _FRAME_ID.search(line)
    fid = int(frame.group(1)) if frame else None
    if not m:
        return [(None, "forward")], fid
    name = m.group(1)
    parts = [name]
    k = name.find("/(")
    if k >= 0 and name.endswith(")"):  # a combined op: prefix/(a:b:c)
        prefix = name[:k]
        parts = [f"{prefix}/{p}" for p in name[k + 2:-1].split(":")]
    out = []
    for p in parts:
        prim = p.rsplit("/", 1)[-1]
        out.append((prim or None, "backward" if "transpose(" in p else "forward"))
    return out, fid


def _frames(text: str) -> dict[int, list[tuple[str, int, str]]]:
    """stack frame id -> [(file, line, function)] innermost first, from the module header."""
    files: dict[int, str] = {}
    fns: dict[int, str] = {}
    locs: dict[int, tuple[int, int, int]] = {}
    parents: dict[int, tuple[int, int]] = {}
    section = None
    for line in text.splitlines():
        s = line.strip()
        if s in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = s
            continue
        if not s or s.startswith(("%", "ENTRY", "HloModule")):
            if s.startswith(("%", "ENTRY")):
                break
            continue
        m = re.match(r'(\d+)\s+(.*)$', s)
        if not m:
            continue
        k, rest = int(m.group(1)), m.group(2)
        if section == "FileNames":
            files[k] = rest.strip('"')
        elif section == "FunctionNames":
            fns[k] = rest.strip('"')
        elif section == "FileLocations":
            g = dict(re.findall(r"(\w+)=(\d+)", rest))
            locs[k] = (int(g.get("file_name_id", 0)), int(g.get("function_name_id", 0)),
                       int(g.get("line", 0)))
        elif section == "StackFrames":
            g = dict(re.findall(r"(\w+)=(\d+)", rest))
            parents[k] = (int(g.get("file_location_id", 0)), int(g.get("parent_frame_id", 0)))
    out: dict[int, list[tuple[str, int, str]]] = {}
    for k in parents:
        chain, seen, cur = [], set(), k
        while cur in parents and cur not in seen:
            seen.add(cur)
            loc, parent = parents[cur]
            if loc in locs:
                f, fn, ln = locs[loc]
                chain.append((files.get(f, "?"), ln, fns.get(fn, "?")))
            if parent == cur:
                break
            cur = parent
        out[k] = chain
    return out


def _computations(text: str) -> tuple[dict[str, list[str]], str | None]:
    comps: dict[str, list[str]] = {}
    entry, cur = None, None
    for line in text.splitlines():
        m = _COMP.match(line)
        if m and not line.startswith(" "):
            cur = m.group("name")
            comps[cur] = []
            if line.startswith("ENTRY"):
                entry = cur
        elif cur is not None:
            if line.startswith("}"):
                cur = None
            else:
                comps[cur].append(line)
    return comps, entry


def _multipliers(comps: dict[str, list[str]], entry: str | None
                 ) -> tuple[dict[str, int], set[str]]:
    """How many times each computation runs per execution of the entry, and the ones inside
    a while loop without a known trip count."""
    mult: dict[str, int] = {}
    unknown: set[str] = set()
    if entry is None:
        return {c: 1 for c in comps}, unknown

    def visit(comp: str, m: int, unk: bool, depth: int) -> None:
        if depth > 64 or comp not in comps:
            return
        mult[comp] = mult.get(comp, 0) + m
        if unk:
            unknown.add(comp)
        for line in comps[comp]:
            callees = _CALLEE.findall(line)
            b = _BRANCHES.search(line)
            if b:
                callees += [("branch", c.strip().lstrip("%")) for c in b.group(1).split(",")]
            if not callees:
                continue
            trip = _TRIP.search(line)
            for role, callee in callees:
                if role == "to_apply":
                    continue  # reducers compute, they do not communicate
                if role == "body":
                    visit(callee, m * (int(trip.group(1)) if trip else 1), unk or not trip,
                          depth + 1)
                else:
                    visit(callee, m, unk, depth + 1)

    visit(entry, 1, False, 0)
    return mult, unknown


def parse(text: str, names: Sequence[str], sizes: Sequence[int],
          where_of: Callable[[list[tuple[str, int, str]]], str | None]) -> list[CompiledOp]:
    """Every collective of the compiled module `text` on a mesh (`names`, `sizes`)."""
    comps, entry = _computations(text)
    mult, unknown = _multipliers(comps, entry)
    frames = _frames(text)
    index: _Users | None = None
    out: list[CompiledOp] = []
    for comp, lines in comps.items():
        if mult.get(comp, 0) == 0:
            continue
        for line in lines:
            m = _OP.match(line)
            if not m:
                continue
            kind, shape = m.group("op"), m.group("shape")
            sizes_ = shape_bytes(shape)
            if m.group("start") and kind in ("all-gather", "collective-permute") and \
                    len(sizes_) >= 2:
                sizes_ = [sizes_[1]]  # (operand, result, ...): the result
            axes = groups_to_axes(_groups(line), names, sizes, kind == "collective-permute")
            meta, fid = _metadata(line)
            if kind == "all-gather" and index is None:
                index = _users(comps)
            kernel = _kernel_user(m.group("name"), index) if index is not None else None
            where = where_of(frames.get(fid, [])) if fid is not None else None
            if kind == "all-to-all" and len(meta) == 1:
                # the tuple form of an all-to-all: one chunk per peer, one op
                sizes_ = [sum(sizes_)]
            elif len(meta) != len(sizes_):
                # XLA's combiner merged operands of equations with the same op_name (one
                # name for all), or of one equation (a psum of several operands)
                meta = [meta[0]] * len(sizes_)
            for nbytes, (prim, phase) in zip(sizes_, meta, strict=True):
                out.append(CompiledOp(kind, axes, mult[comp], nbytes, prim, phase, where,
                                      combined=len(sizes_), unknown_trip=comp in unknown,
                                      feeds_kernel=kernel))
    return out


_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*.*?\s([a-z][\w\-]*)\((.*)$")
#: ops that pass a value on unchanged (into a tuple, out of it, into a called computation)
_PASS = ("tuple", "get-tuple-element", "bitcast", "copy", "reshape", "conditional", "call",
         "parameter")


_Users = tuple[dict[str, list[tuple[str, str, str]]], dict[str, list[str]]]


def _users(comps: dict[str, list[str]]) -> _Users:
    """name -> [(user, its op, its line)] and computation -> its parameters' names."""
    users: dict[str, list[tuple[str, str, str]]] = {}
    params: dict[str, list[str]] = {}
    for comp, lines in comps.items():
        for line in lines:
            m = _INSTR.match(line)
            if not m:
                continue
            out, op, rest = m.groups()
            if op == "parameter":
                params.setdefault(comp, []).append(out)
            for used in re.findall(r"%([\w.\-]+)", rest.split(", metadata=")[0]):
                users.setdefault(used, []).append((out, op, line))
    return users, params


def _kernel_user(name: str, index: _Users) -> str | None:
    """The custom_call_target of a custom-call that consumes `%name`, through tuples,
    bitcasts, copies and into called computations (a callback runs in a conditional)."""
    users, params = index
    seen, stack = {name}, [name]
    while stack:
        for out, op, line in users.get(stack.pop(), ()):
            if op == "custom-call":
                t = re.search(r'custom_call_target="([^"]*)"', line)
                return t.group(1) if t else "custom-call"
            if op not in _PASS:
                continue
            nxt = [out]
            if op in ("conditional", "call"):
                for _, callee in _CALLEE.findall(line):
                    nxt += params.get(callee, [])
                b = _BRANCHES.search(line)
                for callee in (b.group(1).split(",") if b else ()):
                    nxt += params.get(callee.strip().lstrip("%"), [])
            for n in nxt:
                if n not in seen:
                    seen.add(n)
                    stack.append(n)
    return None


def summary(ops: Sequence[CompiledOp]) -> dict[tuple[Any, ...], tuple[int, int]]:
    """(kind, axes) -> (count, bytes)."""
    out: dict[tuple[Any, ...], tuple[int, int]] = {}
    for op in ops:
        c, b = out.get((op.kind, op.axes), (0, 0))
        out[(op.kind, op.axes)] = (c + op.count, b + op.bytes)
    return out
