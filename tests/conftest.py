import atexit
import os
import shutil
import tempfile
from pathlib import Path

# 8 simulated CPU devices, set before JAX is imported anywhere in the test session.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA's CPU backend without LLVM's optimisations (`--xla_backend_optimization_level=0`): the
# suites compile thousands of small programs and run each a few times, so compiling is much of
# their time (test_examples + test_production_patterns: 122 -> 77 CPU s). The programs are the
# same HLO, so every comparison (typed vs raw, against one device) reads the same numbers; the
# StableHLO the identity tests compare is made before XLA. A level in XLA_FLAGS already wins.
if "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"

import _helpers  # noqa: E402
import jax  # noqa: E402
import pytest  # noqa: E402

# JAX's persistent compilation cache, in a directory of this process's own (removed at exit):
# the suites compile the same program many times (typed and raw lower to one program by design,
# and each reference runs under several faces), and a hit skips XLA's compile (about half the
# time of the heaviest modules). Every entry is cached (no minimum compile time). One directory
# per process, so no two processes write one entry at once (JAX locks its files only when it
# also evicts, which scans the whole directory at each write); subprocesses compile without it.
# `SPMDTYPED_TEST_JAX_CACHE=0`, or a `JAX_COMPILATION_CACHE_DIR` of one's own, turns it off.
if os.environ.get("SPMDTYPED_TEST_JAX_CACHE", "1") != "0" and not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    _jax_cache = tempfile.mkdtemp(prefix="spmdtyped-jax-cache-")
    atexit.register(shutil.rmtree, _jax_cache, ignore_errors=True)
    jax.config.update("jax_compilation_cache_dir", _jax_cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


@pytest.fixture(scope="session")
def mesh_ij():
    """The reference mesh of shared/reference: {"i": 2, "j": 4} (`_helpers.mesh_ij`)."""
    return _helpers.mesh_ij()


@pytest.fixture(scope="session")
def mesh_dp_tp():
    """{"dp": 2, "tp": 4} on the same 8 devices (`_helpers.mesh_dp_tp`)."""
    return _helpers.mesh_dp_tp()



# ------------------------------------------------------------------ pytest-xdist (`make test`)
# `make test` runs two workers with `--dist loadgroup`, which here means: the tests of a module
# of GROUPED_MODULES run on one worker, one after another; every other test is handed out on
# its own to whichever worker is free. A module-scoped fixture runs once per worker that uses
# it, so the modules with a costly one (a mypy, pyright or tracing run of seconds) are grouped,
# and so are the modules whose last test counts what the others recorded (it re-runs what it
# did not see). Each worker has its own mypy cache (`test_typing.CACHE`) and `tmp_path` root.
#
# (xdist's own loadgroup reads `xdist_group` marks into the node ids, which pytest 9 no longer
# lets a plugin rename, so the grouping is by module, in the scheduler below.)

GROUPED_MODULES = frozenset({
    "test_typing", "test_typing_examples", "test_docs",                  # one mypy run each
    "test_stubgen_docs", "test_stubgen_examples", "test_stubgen_oracle",  # pyright and mypy
    "test_stubgen_pages",                                                 # two pyright runs
    "test_lowering_scan", "test_porting_codemod",                         # one tracing scan each
    "test_porting", "test_porting_styles",                                # count what ran (HANDLED)
})


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own scheduler factory
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        """LoadScopeScheduling with one scope per test, except a whole module of
        GROUPED_MODULES; scopes go out largest first (`--loadscope-reorder`, the default)."""

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if Path(path).stem in GROUPED_MODULES else nodeid

    return ModuleGroups(config, log)


# ------------------------------------------------------------------ `make test` vs `test-long`
# The long sweeps and oracles (a pyright / mypy oracle over every overload, every row x every
# state through the runtime and the plugin, random programs against JAX, every op lowered, the
# fuzz harness, the report of every example against its compiled program, pyright and mypy
# over the docs' and the examples' code) are marked `slow`:
# `make test` leaves them out (under 10 minutes on 2 cores), `make test-long` runs them, and CI
# runs both on both legs.
SLOW_MODULES = frozenset({
    "test_stubgen_oracle", "test_stubgen", "test_stubgen_examples", "test_parity",
    "test_plugin_differential", "test_differential", "test_lowering_scan", "test_fuzz_api",
    "test_report_examples", "test_report_porting", "test_stubgen_docs", "test_typing_examples",
    "test_jax_suite", "test_porting_tools", "test_migrate_vma_suites",
    # flax linen's decoder block and its `nn.scan` stack through four faces (about 2.5 min of
    # CPU): its defects are shared with the faster engine suites, its world is linen's
    "test_engine_linen",
    # JAX's shard_map tutorial run raw, typed and ported, cell by cell (three processes, ~75 s)
    "test_jax_tutorial",
    # flax's own nnx.shard_map tests, as flax runs them and checked (two processes)
    "test_flax_suite",
    # the command line on modules written as scripts and notebooks, each in its own process
    # (~75 s of CPU; `test_porting_cli` keeps the command line's fast cases in `make test`)
    "test_cli_module",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
