"""`python -m spmdtyped infer FILE[:FUNC] [--mesh dp=2,tp=4] [--in-specs ...] [--shapes ...]`.

Prints the typed signature of a raw per-shard function, a per-line listing of the states
of every traced equation, and the strict-rule violations.

The module is read (`discover`): its `jax.shard_map` calls (decorators, assignments,
`functools.partial`, calls under `jax.set_mesh` / `use_mesh`) give the mesh and the specs, and
a call of the shard_map'd function on module-level arrays gives the shapes. `FUNC` is the body
given to shard_map or a name bound to the shard_map'd function; without `FUNC` every shard_map
body of the file is checked. The flags fill in what the module does not say, and win over
what it says (`--mesh` too on a module that calls `jax.set_mesh`: the trace runs under the
command line's mesh). `module:function` and a target given all of `--in-specs`, `--out-specs`
and `--shapes` are traced as given (the target may be decorated: `@jax.shard_map(...)`,
`@st.adapters.typed_shard_map(...)`, `@jax.jit`; the per-shard function inside is checked).

Exit status: 0 when every checked body is clean, 1 when one has violations, 2 for bad usage or
a crash (the module fails to import, a body whose mesh, specs or shapes cannot be told, JAX
rejects the program for a reason that is not a manual-axis type); 2 wins over 1.

`--vma-changes FILE` (`vma.py`): for code written with `jax.shard_map(..., check_vma=False)`,
what turning JAX's checks on changes (the report of `port --enable-vma`, no rewrite); exit 0
when nothing changes, 1 when something does.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import linecache
import math
import os
import sys
from typing import Any

from .args import Flags, load_function, parse_mesh, parse_shapes


def setup_devices(sizes: tuple[int, ...]) -> None:
    """Before JAX is imported: CPU devices enough for the mesh (and for a module that builds
    its own mesh at import, typically 8). Tracing needs only abstract values."""
    if "jax" not in sys.modules:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        flag = f"--xla_force_host_platform_device_count={max(8, math.prod(sizes))}"
        if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()


def split_target(target: str) -> tuple[str, str | None]:
    """`FILE`, `FILE:FUNC` or `module:function` -> (file or module, function or None)."""
    head, sep, tail = target.rpartition(":")
    if not sep or not head or os.sep in tail or tail.endswith(".py"):
        return target, None
    return head, tail or None


def module_file(name: str) -> str:
    if name.endswith(".py") or os.sep in name:
        return name
    import importlib.util

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        raise ValueError(f"no module {name!r}")
    return spec.origin


def home_file(fn: Any) -> str | None:
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = inspect.unwrap(fn)
    return getattr(getattr(fn, "__code__", None), "co_filename", None)


def _jobs(args: argparse.Namespace, flags: Flags) -> tuple[list[Any], list[str]]:
    """The bodies to check, and the messages of those that cannot be traced."""
    from jax.sharding import PartitionSpec

    from . import discover as _discover

    where, func = split_target(args.target)
    explicit = bool(args.in_specs and args.out_specs and args.shapes)
    if func is not None and (explicit or not (where.endswith(".py") or os.sep in where)):
        from .. import _compat

        fn = inspect.unwrap(load_function(args.target))
        mesh = flags.mesh_obj if flags.mesh_obj is not None else \
            _compat.context_mesh(concrete=True)
        site = _discover.Site(body=fn, name=func, line=None, mesh=mesh,
                              in_specs=_discover.UNKNOWN, out_specs=_discover.UNKNOWN)
        made = _discover.job(site, flags, PartitionSpec, args.target)
        return ([made], []) if not isinstance(made, str) else ([], [made])
    path = module_file(where)
    _module, sites = _discover.discover(path)
    if func is not None:
        sites = [s for s in sites if s.matches(func)]
    if not sites:
        what = f"of {func} " if func else ""
        return [], [f"{path}: no jax.shard_map call {what}found (pass {args.target}:FUNC with "
                    f"--in-specs, --out-specs and --shapes)"]
    jobs, errors = [], []
    for site in sites:
        made = _discover.job(site, flags, PartitionSpec,
                             f"{os.path.basename(path)}:{site.line or '?'}")
        (errors if isinstance(made, str) else jobs).append(made)
    return jobs, errors


def _print_report(rep: Any, fn: Any, args: argparse.Namespace) -> int:
    print(rep.signature)
    print()
    home = home_file(fn)
    last = None
    for step in rep.steps:
        if step.file is None or (not args.all_lines and home and step.file != home):
            continue
        if step.auto and not args.casts:
            continue
        key = (step.file, step.line)
        if key != last:
            src = linecache.getline(step.file, step.line or 0).rstrip()
            print(f"{os.path.basename(step.file)}:{step.line}: {src.strip()}")
            last = key
        print(f"    {step.describe()}")
    print()
    if rep.violations:
        print(f"{len(rep.violations)} violation(s):")
        for v in rep.violations:
            print(f"{getattr(v, 'source', None) or '?'}: {v.code}")
            print("    " + str(v).replace("\n", "\n    "))
        return 1
    print("ok: no violations")
    return 0


def _check(job: Any, args: argparse.Namespace, flags: Flags) -> int:
    from .._errors import SpmdTypeError
    from ..adapters._conventions import made_current
    from ..adapters._infer import infer

    try:
        # the site's own mesh made current (the command line's, else the one the module gave
        # that call): a module that sets another mesh later would otherwise trace this call
        # against it (JAX: "The context mesh ... should match the mesh passed to shard_map")
        with made_current(job.mesh):
            rep = infer(job.fn, *job.args, mesh=job.mesh, in_specs=job.in_specs,
                        out_specs=job.out_specs, check_vma=job.check_vma is not False)
    except SpmdTypeError as e:
        print(f"{getattr(e, 'source', None) or '?'}: {e.code}\n{e}", file=sys.stderr)
        return 2 if e.code.startswith("SPMD5") else 1
    except Exception as e:  # noqa: BLE001 - a crash is exit 2, not "violations found"
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"error: tracing {job.where} failed: {type(e).__name__}: {first}", file=sys.stderr)
        return 2
    return _print_report(rep, job.fn, args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spmdtyped infer",
        description="Infer the typed signature of raw per-shard functions and check them with "
                    "spmdtyped's strict rules. The module's own shard_map calls give the mesh, "
                    "the specs and (from module-level arrays) the shapes; the flags fill in "
                    "the rest.")
    parser.add_argument("target", help="FILE, FILE:FUNC or module:function (FUNC: a body given "
                                       "to shard_map, or a name bound to the shard_map'd function)")
    parser.add_argument("--mesh", help="axis sizes, e.g. dp=2,tp=4 (default: the module's mesh)")
    parser.add_argument("--in-specs", help="Python expression, e.g. \"(P('dp'), P(None, 'tp'))\"")
    parser.add_argument("--out-specs", help="Python expression, e.g. \"P('dp')\"")
    parser.add_argument("--shapes", help="global argument shapes, e.g. \"f32[8,16] f32[16,32]\"")
    parser.add_argument("--all-lines", action="store_true",
                        help="list equations from every file, not only the function's")
    parser.add_argument("--casts", action="store_true",
                        help="also list the pvary casts JAX inserts by itself")
    parser.add_argument("--vma-changes", action="store_true",
                        help="for code written with jax.shard_map(..., check_vma=False): what "
                             "turning JAX's checks on changes (the edits `port --enable-vma` "
                             "makes, the lines whose numbers change), without rewriting FILE; "
                             "exit 1 when something changes")
    args = parser.parse_args(argv)

    try:
        sizes = parse_mesh(args.mesh) if args.mesh else ((), ())
        if args.shapes:
            parse_shapes(args.shapes)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    setup_devices(sizes[1])
    if args.vma_changes:
        from .vma import vma_changes

        return vma_changes(module_file(split_target(args.target)[0]), args)
    try:
        flags = Flags(args, sizes)
        jobs, errors = _jobs(args, flags)
    except Exception as e:  # noqa: BLE001 - report usage problems, not tracebacks
        print(f"error: cannot load {args.target}: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    for message in errors:
        print(f"error: {message}", file=sys.stderr)
    status = 2 if errors else 0
    for i, job in enumerate(jobs):
        if len(jobs) > 1 or errors:
            print(f"{'' if i == 0 else chr(10)}== {job.where}: {job.name}")
        if len(job.args) != len(job.in_specs if isinstance(job.in_specs, tuple) else job.args):
            print(f"error: {job.where}: {len(job.args)} shapes for {len(job.in_specs)} in_specs",
                  file=sys.stderr)
            status = 2
            continue
        got = _check(job, args, flags)
        status = max(status, got)
    return status


if __name__ == "__main__":
    sys.exit(main())
