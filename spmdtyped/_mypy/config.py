"""The plugin's configuration: which JAX rule set the checks assume, and the cache digest.

`[spmdtyped]` with `jax = 0.12` in a mypy ini file, or `[tool.spmdtyped]` in pyproject.toml
(quoted or not: `jax = 0.10` is read as the text `0.10`, not the float 0.1); `unknown = true`
turns on the opt-in code `spmd-unknown` (`_mypy.unknown`: where a typed value's state is lost).
"""

from __future__ import annotations

import configparser
import hashlib
import os
import sys
import tomllib
from pathlib import Path
from typing import Final

from .. import _rules

#: the JAX rule set the checks assume: `_rules.CONSERVATIVE` (what every supported JAX allows)
#: unless the configuration says otherwise
FEATURE_SETS: Final = {"conservative": _rules.CONSERVATIVE, "0.10": _rules.JAX_0_10,
                       "0.12": _rules.JAX_0_12, "0.12.1": _rules.JAX_0_12_1}


class Config:
    """The active settings (one plugin instance per mypy run)."""

    features: _rules.Features = _rules.CONSERVATIVE
    jax: str = "conservative"
    #: `unknown = true`: report `spmd-unknown` (`_mypy.unknown`)
    unknown: bool = False

    def load(self, config_file: str | None) -> None:
        self.jax = read_config(config_file)
        self.features = FEATURE_SETS[self.jax]
        self.unknown = read_flag(config_file, "unknown")


CONFIG: Final = Config()


def _toml_setting(config_file: str) -> object:
    with open(config_file, "rb") as f:
        # parse_float=str: an unquoted `jax = 0.10` keeps its text (a float would read 0.1)
        data = tomllib.load(f, parse_float=str)
    section = data.get("tool", {}).get("spmdtyped", {})
    return section.get("jax", "conservative") if isinstance(section, dict) else "conservative"


def read_section(config_file: str | None) -> dict[str, str]:
    """Every setting of the `[spmdtyped]` section (`[tool.spmdtyped]` in pyproject.toml) as
    ini text (`python -m spmdtyped check` copies them into the file it hands mypy)."""
    if not config_file or not os.path.isfile(config_file):
        return {}
    if config_file.endswith(".toml"):
        with open(config_file, "rb") as f:
            section = tomllib.load(f, parse_float=str).get("tool", {}).get("spmdtyped", {})
        if not isinstance(section, dict):
            return {}
        return {k: (("true" if v else "false") if isinstance(v, bool) else str(v))
                for k, v in section.items()}
    cp = configparser.ConfigParser(interpolation=None)
    cp.read(config_file)
    return dict(cp.items("spmdtyped")) if cp.has_section("spmdtyped") else {}


_TRUE: Final = ("1", "true", "yes", "on")
_FALSE: Final = ("0", "false", "no", "off", "")


def read_flag(config_file: str | None, key: str) -> bool:
    """A boolean setting of the `[spmdtyped]` section (`unknown = true`; off when absent)."""
    value = read_section(config_file).get(key, "false").strip().strip("'\"").lower()
    if value not in _TRUE + _FALSE:
        print(f"error: spmdtyped.mypy_plugin: [spmdtyped] {key} = {value!r} in {config_file}; "
              "expected true or false", file=sys.stderr)
        raise SystemExit(2)
    return value in _TRUE


def read_config(config_file: str | None) -> str:
    """The `jax` setting of the `[spmdtyped]` section (`[tool.spmdtyped]` in pyproject.toml)."""
    if not config_file or not os.path.isfile(config_file):
        return "conservative"
    if config_file.endswith(".toml"):
        value = _toml_setting(config_file)
    else:
        cp = configparser.ConfigParser(interpolation=None)
        cp.read(config_file)
        value = cp.get("spmdtyped", "jax", fallback="conservative")
    value = str(value).strip().strip("'\"")
    if value not in FEATURE_SETS:
        msg = (f"spmdtyped.mypy_plugin: [spmdtyped] jax = {value!r} in {config_file}; expected "
               f"one of {sorted(FEATURE_SETS)}")
        # a configuration error, as mypy reports its own: the message and exit status 2 (an
        # exception here would be an INTERNAL ERROR with a traceback)
        print(f"error: {msg}", file=sys.stderr)
        raise SystemExit(2)
    return value


def rules_digest() -> str:
    """A digest of everything a cached result depends on besides the checked code: the plugin
    package, the rule table (with the refinement rules), the surface table, the error registry,
    the hints and the static view."""
    here = Path(__file__).resolve().parent
    top = here.parent
    h = hashlib.sha256()
    files = sorted(here.glob("*.py")) + [top / n for n in (
        "mypy_plugin.py", "_surface.py", "_static.py", "_typed/hints.py")]
    files += [p for d in ("_rules", "_errors") for p in sorted((top / d).rglob("*.py"))]
    for path in files:
        try:
            h.update(path.read_bytes())
        except OSError:
            pass
    return h.hexdigest()[:16]
