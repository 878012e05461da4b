"""`python -m spmdtyped port FILE...`: rewrite raw shard_map code with the codemod
(`adapters/_port/codemod.py`).

The module is read first (`discover`, as `infer` reads it): when its `jax.shard_map` calls
give the mesh, the specs and the shapes (module-level arrays passed to the shard_map'd
function), or the flags fill them in, the bodies are traced and the file is ported to typed
code with the states JAX observed (the checked mode); `--entry FUNC` (repeatable) names the
bodies to trace (any function of FILE, with `--in-specs`, `--out-specs`, `--shapes` when the
module does not shard_map it). Otherwise, or with `--static` (no import), the spec-driven
mode: annotations from the literal specs. Exit status 0, or 1 with `--check` when a file would
change; 2 for bad usage (an `--entry` that cannot be traced, a file that cannot be read).

`--enable-vma` (`vma.py`): turn JAX's checks on in code written for `check_vma=False` instead
of porting it to typed code; exit 1 also when JAX still rejects the result or its numbers
change (the report names the lines)."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Sequence
from typing import Any

import libcst as cst


def _runs(path: str, args: argparse.Namespace) -> tuple[list[Any], list[str]]:
    """The bodies of `path` to observe (`discover.Job`s, each on the command line's mesh
    when it gives one, else its own) and the messages of those that cannot be traced."""
    import inspect

    from .args import parse_mesh
    from .infer import Flags

    sizes = parse_mesh(args.mesh) if args.mesh else ((), ())

    from jax.sharding import PartitionSpec

    from . import discover as _discover

    flags = Flags(args, sizes)
    module, sites = _discover.discover(path)
    where = os.path.basename(path)
    jobs, errors = [], []
    if args.entry:
        for entry in args.entry:
            mine = [s for s in sites if s.matches(entry)]
            if not mine:
                fn = getattr(module, entry, None)
                if not callable(fn):
                    errors.append(f"{where}: no function {entry}")
                    continue
                mine = [_discover.Site(body=inspect.unwrap(fn), name=entry, line=None,
                                       mesh=_discover.UNKNOWN, in_specs=_discover.UNKNOWN,
                                       out_specs=_discover.UNKNOWN)]
            for site in mine:
                made = _discover.job(site, flags, PartitionSpec, f"{where}:{site.line or entry}")
                (errors if isinstance(made, str) else jobs).append(made)
    else:
        for site in sites:
            made = _discover.job(site, flags, PartitionSpec, f"{where}:{site.line}")
            if not isinstance(made, str):
                jobs.append(made)
    # code run with check_vma=False keeps its raw body (on typed_shard_map): not observed
    jobs = [j for j in jobs if j.check_vma is True]
    return jobs, errors


def _observed_states(path: str, args: argparse.Namespace) -> tuple[Any, Any, list[str]]:
    """Checked mode: `(states, declared, errors)`, `states` None when nothing can be traced."""
    from ..adapters._port.observe import observe_all

    jobs, errors = _runs(path, args)
    if not jobs or (args.entry and errors):
        return None, None, errors
    # (each run is traced with its own mesh current: `observe`, the command line's mesh when
    # it gives one, `_discover.job`)
    runs = [(j.fn, j.args, j.in_specs, j.out_specs, j.mesh) for j in jobs]
    states, declared = observe_all(runs, file=os.path.abspath(path))
    return states, declared, errors


def main(argv: Sequence[str] | None = None) -> int:
    from .vma import EPILOG

    parser = argparse.ArgumentParser(
        prog="python -m spmdtyped port", epilog=EPILOG,
        description="Rewrite raw jax.shard_map code to spmdtyped. The module's shard_map calls "
                    "(mesh, specs, module-level arrays) are traced and the code ported to typed "
                    "code with the states JAX observed; the flags fill in what the module does "
                    "not say. Without them (or --static): checked collectives, checked "
                    "shard_map, annotations from the literal specs.")
    parser.add_argument("files", nargs="+", metavar="FILE")
    parser.add_argument("--write", action="store_true", help="rewrite the files in place")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if any file would change (prints the diff)")
    parser.add_argument("--static", action="store_true",
                        help="do not import the module: annotations from the literal specs only")
    parser.add_argument("--enable-vma", action="store_true",
                        help="turn JAX's checks on in code written for jax.shard_map(..., "
                             "check_vma=False): the check_vma=True program JAX accepts, with "
                             "the same numbers, and a report of what changes (see below)")
    parser.add_argument("--run", metavar="FUNC",
                        help="with --enable-vma: a function of the first FILE, called with no "
                             "arguments, that runs the code to migrate once (a step on small "
                             "inputs); the shard_maps it calls in any FILE are migrated, "
                             "however deep (a decorator inside a model's function)")
    checked = parser.add_argument_group("what the module does not say (one FILE)")
    checked.add_argument("--entry", action="append", default=[], metavar="FUNC",
                         help="a function of FILE to trace (repeatable; default: every body "
                              "the module gives jax.shard_map)")
    checked.add_argument("--mesh", help="axis sizes, e.g. dp=2,tp=4 (default: the module's)")
    checked.add_argument("--in-specs", help="Python expression, e.g. \"(P('dp'), P(None, 'tp'))\"")
    checked.add_argument("--out-specs", help="Python expression, e.g. \"P('dp')\"")
    checked.add_argument("--shapes", help="global argument shapes, e.g. \"f32[8,16] f32[16,32]\"")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.entry and (len(args.files) != 1 or args.static):
        print("error: --entry needs one FILE (and no --static)", file=sys.stderr)
        return 2
    from .args import parse_mesh
    from .infer import setup_devices

    try:
        setup_devices(parse_mesh(args.mesh)[1] if args.mesh else ())
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.run and not args.enable_vma:
        print("error: --run goes with --enable-vma", file=sys.stderr)
        return 2
    if args.enable_vma:
        return _enable_vma(args)
    # after the device count is set: the adapters import JAX
    from ..adapters._port.codemod import port_source

    changed = 0
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as fh:
                old = fh.read()
            cst.parse_module(old)
        except (OSError, cst.ParserSyntaxError) as e:
            print(f"{path}: error: {e}", file=sys.stderr)
            return 2
        states = declared = None
        if not args.static:
            try:
                states, declared, errors = _observed_states(path, args)
            except Exception as e:  # noqa: BLE001 - the module's own failure
                if args.entry:
                    print(f"error: cannot observe {path}: {type(e).__name__}: {e}",
                          file=sys.stderr)
                    return 2
                print(f"{path}: not imported ({type(e).__name__}: {e}): annotations from "
                      f"the literal specs only", file=sys.stderr)
                errors = []
            if args.entry and (errors or states is None):
                for message in errors or [f"{path}: nothing to trace"]:
                    print(f"error: --entry needs what the module does not say: {message}",
                          file=sys.stderr)
                return 2
        new, changes = port_source(old, states, declared)
        skipped = [c.removeprefix("unannotated: ") for c in changes
                   if c.startswith("unannotated: ")]
        if skipped:
            print(f"{path}: left unannotated (no array state, or different states at "
                  f"different calls): {', '.join(skipped)}", file=sys.stderr)
        raw = [c.removeprefix("kept raw: ") for c in changes if c.startswith("kept raw: ")]
        if raw:
            print(f"{path}: kept raw (also called outside shard_map): {', '.join(raw)}",
                  file=sys.stderr)
        if new == old:
            continue
        changed += 1
        _write_or_diff(path, old, new, args.write, f"ported {path}")
    if changed == 0:
        print("nothing to port", file=sys.stderr)
    return 1 if args.check and changed else 0


def _write_or_diff(path: str, old: str, new: str, write: bool, done: str) -> None:
    """`new` written over `path` (and `done` printed) with `--write`, else the unified diff."""
    if write:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(new)
        print(done)
    else:
        sys.stdout.writelines(difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True),
            fromfile=f"a/{path}", tofile=f"b/{path}"))


def _enable_vma(args: argparse.Namespace) -> int:
    """`port --enable-vma FILE...`: the diff (or `--write`), the report on stderr."""
    from ..adapters._port.vma_files import relname
    from .vma import print_report, run

    if args.entry or args.static:
        print("error: --enable-vma reads the module's own shard_map calls (no --entry, "
              "--static)", file=sys.stderr)
        return 2
    # the files of the command line migrate together: a shard_map body of one may call the
    # functions of another (a kernel library next to the training script), whose `cond` or
    # loop is then edited where it is written
    originals: dict[str, str] = {}
    current: dict[str, str] = {}
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as fh:
                originals[path] = current[path] = fh.read()
        except OSError as e:
            print(f"error: cannot read {path}: {e}", file=sys.stderr)
            return 2
    status = 0
    # with --run: one migration, of the shard_maps the first file's function calls
    for path in args.files[:1] if args.run else args.files:
        # (a module is imported under its name, `vma_files.relname`: one of another folder
        # with the same name as this one, or as another given before it, cannot be a helper
        # of this migration)
        helpers: dict[str, str] = {}
        named = {relname(path)}
        for p in args.files:
            if relname(p) not in named:
                named.add(relname(p))
                helpers[p] = current[p]
        try:
            old, new, changes, got, helped = run(path, args, helpers, current[path], args.run)
        except Exception as e:  # noqa: BLE001 - the module's own failure is exit 2; the
            # other files migrate still (a kernel module whose own uncalled shard_map cannot
            # be traced keeps the edits the script's migration made in it)
            print(f"error: cannot migrate {path}: {type(e).__name__}: {e}", file=sys.stderr)
            status = 2
            continue
        print_report(path, changes, sys.stderr)
        status = max(status, got)
        current.update(helped)
        if new != old:
            current[path] = new
    changed = [p for p in args.files if current[p] != originals[p]]
    for path in changed:
        turned = current[path].count("check_vma=False") < originals[path].count("check_vma=False")
        done = (f"migrated {path} to check_vma=True" if turned
                else f"edited {path}: the edits JAX asks for with check_vma=True")
        _write_or_diff(path, originals[path], current[path], args.write, done)
    if not changed and status < 2:
        print("nothing to migrate (no jax.shard_map(..., check_vma=False) call"
              f"{f' that {args.run}() makes' if args.run else ''})", file=sys.stderr)
    return max(status, 1 if args.check and changed else 0)


if __name__ == "__main__":
    sys.exit(main())
