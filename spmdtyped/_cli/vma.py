"""`port --enable-vma FILE` and `infer --vma-changes FILE`: a module written for
`jax.shard_map(..., check_vma=False)` migrated to the checks on (`adapters/_port/vma.py`), with
the report of what changes.

The module's shard_map calls are read as `port` and `infer` read them (`discover`: mesh, specs,
module-level arrays; `--mesh`, `--in-specs`, `--out-specs`, `--shapes` fill in the rest). The
report lists `FILE:LINE: what changes; fix: ...`, one line each: the edits made (`check_vma`
turned on, the Varying casts of loop carries and branch outputs JAX asked for, the states of a
Pallas kernel's outputs), the errors no edit fixes, the semantic changes (the outputs of the
original and the migrated program on the same random inputs, a psum / pmean of a gradient JAX
now sums itself) and notes (`psum(1, axis)`, the same number)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

EPILOG = ("--enable-vma: turn JAX's manual-axis checks on in code written for "
          "jax.shard_map(..., check_vma=False): check_vma=True, a "
          "jax.lax.pcast(..., to='varying') on each initial loop carry / cond or switch branch "
          "output JAX rejects (the gradient traced too), the outputs' states in a Pallas "
          "kernel's out_shape, and a report of what changes the numbers (an explicit psum of a "
          "gradient JAX now sums itself; psum(1, axis) for the axis size is a note). The FILEs "
          "migrate "
          "together: an edit JAX asks for in a module the shard_map body calls (kernels.py "
          "next to train.py) is made in that module when it is given too. Exit 1 when JAX "
          "still rejects the result or its numbers change; `infer --vma-changes FILE` prints "
          "the report without rewriting.")


def _jobs(path: str, flags: Any) -> tuple[list[Any], list[str]]:
    """The shard_map bodies of `path` written with `check_vma=False` (as `discover.Job`s, in
    line order), and the messages of those that cannot be traced."""
    from jax.sharding import PartitionSpec

    from . import discover as _discover

    _module, sites = _discover.discover(path)
    jobs: list[Any] = []
    errors: list[Any] = []
    for site in sites:
        if site.check_vma is not False:
            continue
        made = _discover.job(site, flags, PartitionSpec, f"{os.path.basename(path)}:{site.line}")
        (errors if isinstance(made, str) else jobs).append(made)
    return jobs, errors


def _job_line(job: Any) -> int | None:
    tail = job.where.rpartition(":")[2]
    return int(tail) if tail.isdigit() else None


def run(path: str, args: argparse.Namespace, helpers: Mapping[str, str] | None = None,
        source: str | None = None) -> tuple[str, str, list[Any], int, dict[str, str]]:
    """`(old source, new source, report lines (Changes), status, the helpers' new sources)`:
    status 0 (JAX accepts the migrated module), 1 (an error no edit fixes, or the numbers
    change), 2 (cannot be read or traced). `helpers` (path -> current source): the other
    modules of the command line, which the shard_map bodies may call; an error raised in one
    is fixed there (`vma.migrate`). `source`: the module's text to start from (default: the
    file's; its shard_map calls are read from the file)."""
    from ..adapters._conventions import made_current
    from ..adapters._port import vma
    from .args import Flags, parse_mesh

    helpers = dict(helpers or {})
    if source is None:
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
    old = source
    sizes = parse_mesh(args.mesh) if args.mesh else ((), ())
    flags = Flags(args, sizes)
    original, errors = _jobs(path, flags)
    if errors:
        raise ValueError("; ".join(errors))
    if not original:
        return old, old, [], 0, helpers
    lines = {_job_line(j) for j in original}
    order = tuple(original[0].mesh.axis_names)
    names = _module_names(helpers)

    def trace(candidate: str) -> list[tuple[BaseException, int | None]]:
        from . import discover as _discover

        # the candidate is imported from a temporary folder: its siblings are the original's,
        # but for the helpers, written there too (imported anew: the last edit's text)
        folder = os.path.dirname(os.path.abspath(path))
        if folder not in sys.path:
            sys.path.insert(0, folder)
        _forget(names)
        try:
            _module, sites = _discover.discover(candidate)
        except Exception as e:  # noqa: BLE001 - a module that runs its shard_map at import
            return [(e, None)]  # raises JAX's error there: the same error, the same edits
        out: list[tuple[BaseException, int | None]] = []
        for site in sites:
            if site.line not in lines:
                continue
            made = _discover.job(site, flags, _P(), f"{path}:{site.line}")
            if isinstance(made, str):
                raise ValueError(made)
            with made_current(made.mesh):   # the call's own mesh (the command line's first)
                failed = vma.trace_job(made)
            if failed is not None:
                out.append((failed, site.line))
        return out

    with made_current(flags.mesh_obj), _modules_kept(names):
        migration = vma.migrate(path, old, trace, mesh_order=order, helpers=helpers)
    changes = list(migration.changes)
    status = 1 if any(c.kind == "error" for c in changes) else 0
    if status == 0:
        semantic, notes = _semantic(path, migration.source, original, flags, lines,
                                    migration.helpers)
        changes += semantic + notes
        status = 1 if semantic else 0
    return old, migration.source, changes, status, migration.helpers


def _module_names(helpers: Mapping[str, str]) -> list[str]:
    """The names `import` gives the helper modules (their file names' stems)."""
    return [os.path.splitext(os.path.basename(p))[0] for p in helpers]


@contextlib.contextmanager
def _modules_kept(names: Sequence[str]) -> Iterator[None]:
    """`sys.modules`' entries of `names` as they were before, once the block is done (the
    candidates' copies of the helper modules are imported under the same names)."""
    kept = {n: sys.modules[n] for n in names if n in sys.modules}
    try:
        yield
    finally:
        _forget(names)
        sys.modules.update(kept)


def _forget(names: Sequence[str]) -> None:
    """Drop the modules `names` from `sys.modules`: the next `import` reads them anew."""
    for name in names:
        sys.modules.pop(name, None)


def _P() -> Any:
    from jax.sharding import PartitionSpec

    return PartitionSpec


def _semantic(path: str, new: str, original: list[Any], flags: Any,
              lines: set[Any], helpers: Mapping[str, str] | None = None
              ) -> tuple[list[Any], list[Any]]:
    """The semantic changes of the migrated source `new` (its shard_maps run against the
    original's, the SPMD103 psums of its bodies), and the notes (its `psum(1, axis)`, what
    could not be checked). `helpers`: the migrated helper modules (path -> source), imported
    by the candidate from the same folder."""
    import tempfile

    from ..adapters._conventions import made_current
    from ..adapters._port import vma, vma_numbers
    from . import discover as _discover

    helpers = helpers or {}
    out: list[Any] = []
    notes: list[Any] = []
    names = _module_names(helpers)
    with tempfile.TemporaryDirectory(prefix="spmdtyped-vma-") as tmp, _modules_kept(names):
        candidate = vma.write_candidates(tmp, {path: new, **helpers})[path]
        _forget(names)
        _module, sites = _discover.discover(candidate)
        by_line = {s.line: s for s in sites}
        for job in original:
            line = _job_line(job)
            site = by_line.get(line)
            if site is None:
                continue
            made = _discover.job(site, flags, _P(), f"{path}:{line}")
            if isinstance(made, str):
                continue
            with made_current(made.mesh):   # the call's own mesh (the command line's first)
                try:
                    differs = vma_numbers.compare(job, made, line)
                except Exception as e:  # noqa: BLE001 - the program's own failure to run
                    notes.append(vma.Change(line, f"jax.shard_map({job.name}): not compared "
                                            f"({type(e).__name__}: {str(e)[:200]})",
                                            "run both versions by hand (the command runs "
                                            "JAX on CPU devices unless JAX_PLATFORMS names "
                                            "another backend)", "note"))
                    differs = None
                if differs is not None:
                    out.append(differs)
                try:
                    out += vma_numbers.gradient_psums(made, candidate, new, differs is not None)
                except Exception as e:  # noqa: BLE001 - infer's own failure: say so
                    notes.append(vma.Change(line, f"jax.shard_map({job.name}): the gradient "
                                            f"psums not checked ({type(e).__name__})",
                                            f"python -m spmdtyped infer {path}", "note"))
    out += vma_numbers.axis_size_idioms(new)
    for h, text in helpers.items():
        out += [dataclasses.replace(c, file=h) for c in vma_numbers.axis_size_idioms(text)]
    seen: set[tuple[Any, Any, str]] = set()
    unique = []
    for c in out:
        if (c.file, c.line, c.what) not in seen:
            seen.add((c.file, c.line, c.what))
            unique.append(c)
    return [c for c in unique if c.kind == "numbers"], notes + [c for c in unique
                                                                 if c.kind == "note"]


def print_report(path: str, changes: list[Any], stream: Any) -> None:
    """One `FILE:LINE: what; fix: ...` line per change, the kinds in groups."""
    titles = {"edit": "edits (turning the checks on)", "error": "JAX still rejects",
              "numbers": "what changes the numbers", "note": "notes (the numbers do not change)"}
    for kind, title in titles.items():
        mine = [c for c in changes if c.kind == kind]
        if mine:
            print(f"{title}:", file=stream)
            for c in mine:
                print(f"  {c.render(path)}", file=stream)


def vma_changes(path: str, args: argparse.Namespace) -> int:
    """`infer --vma-changes FILE`: the report, no rewrite. Exit 0 when turning the checks on
    changes nothing (no check_vma=False call, or JAX accepts it as it is and the numbers
    agree), 1 when it changes something, 2 when the module cannot be read or traced."""
    try:
        old, new, changes, status, _helpers = run(path, args)
    except Exception as e:  # noqa: BLE001 - the module's own failure is exit 2
        print(f"error: cannot migrate {path}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    if not [c for c in changes if c.kind != "note"]:
        print(f"{path}: nothing changes with check_vma=True")
        print_report(path, changes, sys.stdout)
        return 0
    print_report(path, changes, sys.stdout)
    if new != old:
        print(f"(python -m spmdtyped port --enable-vma --write {path} makes the edits)")
    return 1
