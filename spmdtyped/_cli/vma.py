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


def _sites(module: str, others: Sequence[str], entry: str | None
           ) -> tuple[list[Any], BaseException | None]:
    """The `jax.shard_map` calls to migrate and what the run raised: those of the file
    `module` (`discover`), or, with `entry` (`--run FUNC`), those that `module` and the files
    `others` make while the module's function `entry` runs (at any depth: a shard_map
    decorating a function defined in the model's `attention`)."""
    from . import discover as _discover

    if entry is None:
        _module, sites = _discover.discover(module)
        return sites, None
    imported, _sites_at_import = _discover.import_file(module)
    fn = getattr(imported, entry, None)
    if not callable(fn):
        raise ValueError(f"{os.path.basename(module)} has no function {entry} (--run)")
    return _discover.record_calls(fn, [module, *others])


def _site_key(site: Any, module: str, files: Mapping[str, str]) -> tuple[str, int | None]:
    """A call's file, as its import names it (`files`: absolute path of an original or a
    candidate -> its `vma_files.relname`), and line: equal for the original's call and a
    candidate's."""
    file = os.path.abspath(site.file or module)
    return files.get(file, os.path.basename(file)), site.line


def _files(names: Mapping[str, str], folder: str | None = None) -> dict[str, str]:
    """`_site_key`'s `files`: the originals of `names` (a `vma_files.layout`) and, with
    `folder`, their candidates there."""
    out = {os.path.abspath(p): rel for p, rel in names.items()}
    if folder is not None:
        out.update({os.path.abspath(os.path.join(folder, rel)): rel for rel in names.values()})
    return out


def _job_of(site: Any, module: str, files: Mapping[str, str], flags: Any) -> Any:
    """The `discover.Job` of a call of `module` (or of one of the files `files` names), its
    `where` the call's `_site_key` (`FILE:LINE`); a message when it cannot be traced."""
    from jax.sharding import PartitionSpec

    from . import discover as _discover

    name, line = _site_key(site, module, files)
    return _discover.job(site, flags, PartitionSpec, f"{name}:{line}")


def _jobs(path: str, flags: Any, others: Sequence[str] = (), entry: str | None = None
          ) -> tuple[list[Any], list[str], dict[str, str]]:
    """The shard_map bodies written with `check_vma=False` (`_sites`; as `discover.Job`s, in
    the order they were called), the messages of those that cannot be traced, and the
    files' `vma_files.layout` (read once they are imported)."""
    from ..adapters._port.vma_files import layout

    sites, raised = _sites(path, others, entry)
    if raised is not None:
        raise ValueError(f"{entry}() fails before any change: {type(raised).__name__}: "
                         f"{str(raised)[:300]}") from raised
    names = layout([path, *others])
    files = _files(names)
    jobs: list[Any] = []
    errors: list[Any] = []
    for site in sites:
        if site.check_vma is not False:
            continue
        made = _job_of(site, path, files, flags)
        (errors if isinstance(made, str) else jobs).append(made)
    return jobs, errors, names


def _job_key(job: Any) -> tuple[Any, ...]:
    """`_site_key` of the call a job was made from (its `where`, `FILE:LINE`), and its
    arguments' `discover.signature`: a site called with other shapes (a model's prefill and
    its decode step) is another job."""
    from .discover import signature

    name, _, tail = job.where.rpartition(":")
    return name, int(tail) if tail.isdigit() else None, signature(job.args)


def run(path: str, args: argparse.Namespace, helpers: Mapping[str, str] | None = None,
        source: str | None = None, entry: str | None = None
        ) -> tuple[str, str, list[Any], int, dict[str, str]]:
    """`(old source, new source, report lines (Changes), status, the helpers' new sources)`:
    status 0 (JAX accepts the migrated module), 1 (an error no edit fixes, or the numbers
    change), 2 (cannot be read or traced). `helpers` (path -> current source): the other
    modules of the command line, which the shard_map bodies may call; an error raised in one
    is fixed there (`vma.migrate`). `source`: the module's text to start from (default: the
    file's; its shard_map calls are read from the file). `entry` (`--run FUNC`): the
    shard_maps migrated are those the module's function `entry` calls, in the module and in
    the helpers (a model's functions, called by a step `entry` runs once), their
    `check_vma=False` turned on wherever they are written."""
    from ..adapters._conventions import made_current, manual_axes
    from ..adapters._port import vma, vma_trace
    from .args import Flags, parse_mesh

    helpers = dict(helpers or {})
    if source is None:
        with open(path, encoding="utf-8") as fh:
            source = fh.read()
    old = source
    sizes = parse_mesh(args.mesh) if args.mesh else ((), ())
    flags = Flags(args, sizes)
    original, errors, layout = _jobs(path, flags, list(helpers), entry)
    if errors:
        raise ValueError("; ".join(errors))
    if not original:
        return old, old, [], 0, helpers
    keys = {_job_key(j) for j in original}
    calls = {k[:2] for k in keys}   # (file, line)
    # an error raised outside any traced body (the import, `entry`) is about one of these:
    # their manual axes when they all have the same
    manuals = {manual_axes(j.mesh, j.axis_names) for j in original}
    manual = manuals.pop() if len(manuals) == 1 else ()
    order = tuple(original[0].mesh.axis_names)
    names = _module_names(helpers, layout)
    mine = layout[path]

    def trace(candidate: str) -> list[vma.Failed]:
        # the candidate is imported from a temporary folder: its siblings are the original's,
        # but for the helpers, written there too (imported anew: the last edit's text)
        folder = os.path.dirname(os.path.abspath(path))
        if folder not in sys.path:
            sys.path.insert(0, folder)
        _forget(names)
        there = candidate[:len(candidate) - len(mine)]   # (the candidates' folder)
        files = _files(layout, there)
        try:
            sites, raised = _sites(candidate, [os.path.join(there, layout[h]) for h in helpers],
                                   entry)
        except Exception as e:  # noqa: BLE001 - a module that runs its shard_map at import
            return [vma.Failed(e, None, manual)]   # raises JAX's error there: the same error,
            # the same edits
        out: list[vma.Failed] = []
        for site in sites:
            key = _site_key(site, candidate, files)
            if key not in calls:
                continue
            made = _job_of(site, candidate, files, flags)
            if isinstance(made, str):
                raise ValueError(made)
            if _job_key(made) not in keys:   # (a call with shapes the original's did not have)
                continue
            with made_current(made.mesh):   # the call's own mesh (the command line's first)
                failed = vma_trace.trace_job(made)
            if failed is not None:
                out.append(vma.Failed(failed, site.line if key[0] == mine or site.line is None
                                      else (site.file, site.line),
                                      manual_axes(made.mesh, made.axis_names)))
        if not out and raised is not None:   # `entry`'s own failure, its traceback the place
            out.append(vma.Failed(raised, None, manual))
        return out

    with made_current(flags.mesh_obj), _modules_kept(names):
        migration = vma.migrate(path, old, trace, mesh_order=order, helpers=helpers,
                                turn_on=_reached(original, layout) if entry else None,
                                names=layout)
    changes = list(migration.changes)
    status = 1 if any(c.kind == "error" for c in changes) else 0
    if status == 0:
        semantic, notes = _semantic(path, migration.source, original, flags,
                                    migration.helpers, entry, layout)
        changes += semantic + notes
        status = 1 if semantic else 0
    return old, migration.source, changes, status, migration.helpers


def _reached(jobs: Sequence[Any], names: Mapping[str, str]) -> dict[str, set[int]]:
    """The lines of the calls `jobs` were made from, by file (as given; `names`: their
    `vma_files.layout`)."""
    by_name = {rel: p for p, rel in names.items()}
    out: dict[str, set[int]] = {}
    for job in jobs:
        name, line, _signature = _job_key(job)
        if name in by_name and line is not None:
            out.setdefault(by_name[name], set()).add(line)
    return out


def _module_names(helpers: Mapping[str, str], layout: Mapping[str, str]) -> list[str]:
    """The names `import` gives the helper modules (`vma_files.module_name` of their
    `layout` entries)."""
    from ..adapters._port.vma_files import module_name

    return [module_name(layout[p]) for p in helpers]


@contextlib.contextmanager
def _modules_kept(names: Sequence[str]) -> Iterator[None]:
    """`sys.modules`' entries of `names` as they were before, once the block is done (the
    candidates' copies of the helper modules are imported under the same names)."""
    from ..adapters._port.vma_files import imported

    kept = {n: sys.modules[n] for n in imported(names) if n in sys.modules}
    try:
        yield
    finally:
        _forget(names)
        sys.modules.update(kept)


def _forget(names: Sequence[str]) -> None:
    """Drop the modules `names` (and their packages', `vma_files.imported`) from
    `sys.modules`: the next `import` reads them anew."""
    from ..adapters._port.vma_files import imported

    for name in imported(names):
        sys.modules.pop(name, None)


def _semantic(path: str, new: str, original: list[Any], flags: Any,
              helpers: Mapping[str, str] | None = None, entry: str | None = None,
              layout: Mapping[str, str] | None = None) -> tuple[list[Any], list[Any]]:
    """The semantic changes of the migrated source `new` (its shard_maps run against the
    original's, the SPMD103 psums of their bodies), and the notes (`psum(1, axis)`, what
    could not be checked). `helpers`: the migrated helper modules (path -> source), imported
    by the candidate from the same folder; `entry`, `layout`: as `run`'s."""
    import tempfile

    from ..adapters._conventions import made_current
    from ..adapters._port import vma, vma_files, vma_numbers

    helpers = helpers or {}
    out: list[Any] = []
    notes: list[Any] = []
    layout = {**vma_files.layout([path, *helpers]), **(layout or {})}
    names = _module_names(helpers, layout)
    texts = {layout[p]: t for p, t in {path: new, **helpers}.items()}
    given = {layout[p]: p for p in helpers}
    with tempfile.TemporaryDirectory(prefix="spmdtyped-vma-") as tmp, _modules_kept(names):
        at = vma_files.write_candidates(tmp, {path: new, **helpers}, layout)
        _forget(names)
        sites, _raised = _sites(at[path], [at[h] for h in helpers], entry)
        files = _files(layout, tmp)
        by_key: dict[tuple[Any, ...], Any] = {}
        for site in sites:
            candidate_job = _job_of(site, at[path], files, flags)
            if not isinstance(candidate_job, str):
                by_key.setdefault(_job_key(candidate_job), candidate_job)
        for job in original:
            key = _job_key(job)
            made = by_key.get(key)
            if made is None:
                continue
            line, file = key[1], given.get(key[0])   # (file: a helper's call)
            found: list[Any] = []
            with made_current(made.mesh):   # the call's own mesh (the command line's first)
                try:
                    differs = vma_numbers.compare(job, made, line)
                except Exception as e:  # noqa: BLE001 - the program's own failure to run
                    found.append(vma.Change(line, f"jax.shard_map({job.name}): not compared "
                                            f"({type(e).__name__}: {str(e)[:200]})",
                                            "run both versions by hand (the command runs "
                                            "JAX on CPU devices unless JAX_PLATFORMS names "
                                            "another backend)", "note"))
                    differs = None
                if differs is not None:
                    found.append(differs)
                try:
                    found += vma_numbers.gradient_psums(made, os.path.join(tmp, key[0]),
                                                        texts[key[0]], differs is not None)
                except Exception as e:  # noqa: BLE001 - infer's own failure: say so
                    found.append(vma.Change(line, f"jax.shard_map({job.name}): the gradient "
                                            f"psums not checked ({type(e).__name__})",
                                            f"python -m spmdtyped infer {path}", "note"))
            for c in found:
                (notes if c.kind == "note" and c.what.startswith("jax.shard_map(") else out
                 ).append(dataclasses.replace(c, file=file))
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
