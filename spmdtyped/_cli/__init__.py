"""The command line: `python -m spmdtyped {demo,check,infer,port,explain,report,stubgen}` and `--version`.

One module per command in this folder, each with `main(argv) -> int`; `args` holds the inputs
the commands share."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Sequence

# subcommand -> (module, help); each module has `main(argv: list[str]) -> int`
_COMMANDS = {
    "demo": ("spmdtyped._cli.demo", "a typed dp x tp model on 8 simulated CPU devices"),
    "check": ("spmdtyped._cli.check", "run mypy with the spmdtyped plugin on PATH..."),
    "infer": ("spmdtyped._cli.infer", "infer the typed signature of a raw shard_map function"),
    "port": ("spmdtyped._cli.port", "rewrite raw shard_map code to spmdtyped (libcst); "
                                    "--enable-vma: turn check_vma=False code to check_vma=True"),
    "explain": ("spmdtyped._cli.explain", "print the page of an error code, e.g. SPMD101"),
    "report": ("spmdtyped._cli.report", "the communication report of a step (FILE[:FUNC])"),
    "stubgen": ("spmdtyped._cli.stubgen", "write typings/spmdtyped/ for pyright / Pylance (--axes dp,tp)"),
}


#: subcommand -> (module it needs, the extra that installs it)
_NEEDS = {"check": ("mypy", "mypy"), "port": ("libcst", "port")}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--version", "-V"):
        from .. import __version__

        print(f"spmdtyped {__version__}")
        return 0
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in _COMMANDS:
        print("usage: python -m spmdtyped {" + ",".join(_COMMANDS) + "} ...\n")
        for name, (_, help_) in _COMMANDS.items():
            print(f"  {name:8s} {help_}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    cmd, rest = argv[0], argv[1:]
    if cmd in _NEEDS and importlib.util.find_spec(_NEEDS[cmd][0]) is None:
        dep, extra = _NEEDS[cmd]
        print(f"python -m spmdtyped {cmd} needs {dep}, which is not installed: "
              f"pip install 'spmdtyped[{extra}]'  (or: pip install {dep})", file=sys.stderr)
        return 2
    module = importlib.import_module(_COMMANDS[cmd][0])
    return int(module.main(rest) or 0)

