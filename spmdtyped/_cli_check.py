"""`python -m spmdtyped check PATH...`: mypy with the spmdtyped plugin, without editing any config.

The user's mypy configuration is found as mypy finds it (`--config-file`, else `mypy.ini`,
`.mypy.ini`, `pyproject.toml` with `[tool.mypy]`, `setup.cfg` with `[mypy]` in the current
directory), copied to a temporary ini file with `spmdtyped.mypy_plugin` added to `plugins`, and
mypy runs on it in a subprocess of the same interpreter. Any other option is passed to mypy.
The exit code is mypy's (0 clean, 1 errors, 2 usage or crash).
"""

from __future__ import annotations

import argparse
import configparser
import os
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
    here = Path(__file__).resolve().parent.parent
    return "site-packages" in here.parts or "dist-packages" in here.parts


def merged_config(config: Path | None, directory: Path) -> Path:
    """A temporary ini file: the user's configuration plus the spmdtyped plugin."""
    sections = _sections(config)
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
      `--config-file FILE` names the configuration to extend.

    **Returns:** mypy's exit status: 0 no errors, 1 type errors, 2 bad usage or a crash.

    !!! Example
        ```
        python -m spmdtyped check src/ tests/ --strict
        ```
    """
    parser = argparse.ArgumentParser(
        prog="python -m spmdtyped check",
        description="Run mypy with the spmdtyped plugin (plugins = spmdtyped.mypy_plugin) added "
                    "to your mypy configuration. Other options are passed to mypy.")
    parser.add_argument("paths", nargs="*", help="files or directories to check")
    parser.add_argument("--config-file", help="the mypy configuration to extend")
    args, passthrough = parser.parse_known_args(argv)
    cwd = Path.cwd()
    config = find_config(args.config_file, cwd)
    if config is not None and not config.is_file():
        print(f"python -m spmdtyped check: no such config file: {config}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if not _installed():
        root = str(Path(__file__).resolve().parent.parent)
        env["MYPYPATH"] = os.pathsep.join(p for p in (env.get("MYPYPATH"), root) if p)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="spmdtyped-check-") as tmp:
        ini = merged_config(config, Path(tmp))
        cmd = [sys.executable, "-m", "mypy", "--config-file", str(ini), *passthrough, *args.paths]
        return subprocess.call(cmd, env=env)
