"""`python -m spmdtyped check PATH...`: mypy with the spmdtyped plugin, without editing any config.

The user's mypy configuration is found as mypy finds it (`--config-file`, else `mypy.ini`,
`.mypy.ini`, `pyproject.toml` with `[tool.mypy]`, `setup.cfg` with `[mypy]` in the current
directory), copied to a temporary ini file with `spmdtyped.mypy_plugin` added to `plugins`, and
mypy runs on it in a subprocess of the same interpreter. Any other option is passed to mypy.
The `[spmdtyped]` section (`[tool.spmdtyped]` in pyproject.toml) is copied with it; `--strict`
is mypy's and also turns on `spmd-unknown` (`unknown = true`: where a typed value's state is
lost). The exit code is mypy's (0 clean, 1 errors, 2 usage or crash).
"""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

PLUGIN = "spmdtyped.mypy_plugin"
_CONFIG_NAMES = ("mypy.ini", ".mypy.ini", "pyproject.toml", "setup.cfg")


def find_config(explicit: str | None, cwd: Path) -> Path | None:
    """The configuration file mypy would read (None when there is none)."""
    if explicit:
        return Path(explicit)
    for name in _CONFIG_NAMES:
        path = cwd / name
        if not path.is_file():
            continue
        if name == "pyproject.toml":
            if "mypy" in tomllib.loads(path.read_text()).get("tool", {}):
                return path
        elif name == "setup.cfg":
            cp = configparser.ConfigParser()
            cp.read(path)
            if cp.has_section("mypy"):
                return path
        else:
            return path
    return None


def _ini_value(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _sections(config: Path | None) -> dict[str, dict[str, str]]:
    """The user's configuration as ini sections (`mypy`, `mypy-<module pattern>`)."""
    if config is None:
        return {"mypy": {}}
    if config.suffix == ".toml":
        table = tomllib.loads(config.read_text()).get("tool", {}).get("mypy", {})
        out: dict[str, dict[str, str]] = {"mypy": {}}
        for key, value in table.items():
            if key == "overrides":
                for override in value:
                    modules = override.get("module", [])
                    modules = [modules] if isinstance(modules, str) else modules
                    opts = {k: _ini_value(v) for k, v in override.items() if k != "module"}
                    for module in modules:
                        out.setdefault(f"mypy-{module}", {}).update(opts)
            else:
                out["mypy"][key] = _ini_value(value)
        return out
    cp = configparser.ConfigParser(interpolation=None)
    cp.read(config)
    return {s: dict(cp.items(s)) for s in cp.sections() if s == "mypy" or s.startswith("mypy-")}


def _installed() -> bool:
    """Whether mypy finds `spmdtyped` in site-packages (else: a source checkout)."""
    here = Path(__file__).resolve().parents[2]  # the folder that holds `spmdtyped/`
    return "site-packages" in here.parts or "dist-packages" in here.parts


def merged_config(config: Path | None, directory: Path, *, strict: bool = False) -> Path:
    """A temporary ini file: the user's configuration plus the spmdtyped plugin, with the
    `[spmdtyped]` settings (`strict`: `unknown = true` added)."""
    from .._mypy.config import read_section

    sections = _sections(config)
    own = read_section(str(config)) if config is not None else {}
    if strict:
        own["unknown"] = "true"
    if own:
        sections["spmdtyped"] = own
    main = sections.setdefault("mypy", {})
    plugins = [p.strip() for p in main.get("plugins", "").replace("\n", ",").split(",") if p.strip()]
    if PLUGIN not in plugins:
        plugins.append(PLUGIN)
    main["plugins"] = ", ".join(plugins)
    if not _installed():
        # a source checkout: mypy finds the package through mypy_path; do not report its files
        sections.setdefault("mypy-spmdtyped.*", {}).setdefault("ignore_errors", "True")
    cp = configparser.ConfigParser(interpolation=None)
    for name, opts in sections.items():
        cp[name] = opts
    path = directory / "spmdtyped-mypy.ini"
    with path.open("w") as f:
        cp.write(f)
    return path


def main(argv: list[str]) -> int:
    """Run mypy with the spmdtyped plugin on `PATH...`; returns mypy's exit code.

    **Arguments:**

    - `argv`: `PATH...` plus any mypy options (`--strict`, `--cache-dir DIR`, ...);
      `--config-file FILE` names the configuration to extend; `--strict` also turns on the
      plugin's `spmd-unknown` (the first place where a typed value's state is lost).

    **Returns:** mypy's exit status: 0 no errors, 1 type errors, 2 bad usage or a crash.

    !!! Example
        ```
        python -m spmdtyped check src/ tests/ --strict
        ```
    """
    if any(a in ("-h", "--help") for a in argv):
        from .._mypy.codes import OPT_IN

        opt_in = "\n".join(f"  {c.code}: {c.description}" for c in OPT_IN)
        print("usage: python -m spmdtyped check [--config-file FILE] [mypy options] PATH...\n\n"
              "Run mypy with the spmdtyped plugin (plugins = spmdtyped.mypy_plugin) added to your "
              "mypy configuration.\nEvery other option is mypy's, in either form "
              "(--cache-dir DIR or --cache-dir=DIR); --strict also turns on spmd-unknown.\n\n"
              f"Codes off by default (enable_error_code = CODE):\n{opt_in}")
        return 0
    explicit, rest = split_config_file(argv)
    cwd = Path.cwd()
    config = find_config(explicit, cwd)
    if config is not None and not config.is_file():
        print(f"python -m spmdtyped check: no such config file: {config}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    bases = script_bases([a for a in rest if not a.startswith("-") and Path(a).is_dir()])
    if bases and not {"--explicit-package-bases", "--namespace-packages"} & set(rest):
        # a folder of scripts (no __init__.py) importing each other: module names relative to
        # the folder that makes each import and each file agree (mypy's "Source file found
        # twice under different module names" otherwise)
        rest = ["--explicit-package-bases", *rest]
    mypypath = [str(b) for b in bases]
    if not _installed():
        root = str(Path(__file__).resolve().parents[2])  # the folder that holds `spmdtyped/`
        mypypath.append(root)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    if mypypath:
        env["MYPYPATH"] = os.pathsep.join(p for p in (env.get("MYPYPATH"), *mypypath) if p)
    with tempfile.TemporaryDirectory(prefix="spmdtyped-check-") as tmp:
        ini = merged_config(config, Path(tmp), strict="--strict" in rest)
        cmd = [sys.executable, "-m", "mypy", "--config-file", str(ini), *rest]
        return subprocess.call(cmd, env=env)


def split_config_file(argv: list[str]) -> tuple[str | None, list[str]]:
    """(`--config-file` value, every other argument in order): the rest goes to mypy as
    written, so `--opt VALUE` and `--opt=VALUE` both reach it intact."""
    explicit, rest, i = None, [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--config-file" and i + 1 < len(argv):
            explicit, i = argv[i + 1], i + 2
            continue
        if a.startswith("--config-file="):
            explicit = a.split("=", 1)[1]
        else:
            rest.append(a)
        i += 1
    return explicit, rest


def script_bases(dirs: list[str]) -> list[Path]:
    """Package bases for the folders of scripts (no `__init__.py`) among `dirs`: the folder
    itself, or its parent when its files import it as a package (`from examples import x`)."""
    bases: list[Path] = []
    for d in map(Path, dirs):
        if (d / "__init__.py").is_file():
            continue
        d = d.resolve()
        pattern = re.compile(rf"^\s*(from|import)\s+{re.escape(d.name)}\b", re.MULTILINE)
        as_package = any(pattern.search(f.read_text(errors="replace")) for f in d.rglob("*.py"))
        base = d.parent if as_package else d
        if base not in bases:
            bases.append(base)
    return bases
