"""pytest's entry to JAX's suite (see `load.py`): `SPMDTYPED_JAX_SUITE=raw|typed pytest
tests/jax_suite/suite_entry.py`. Run by `test_jax_suite.py`, not collected by itself (its name
does not start with `test_`)."""

import os

from tests.jax_suite.load import load

_mod = load(os.environ.get("SPMDTYPED_JAX_SUITE", "typed"))
globals().update({k: v for k, v in vars(_mod).items()
                  if isinstance(v, type) and k.endswith("Test")})
