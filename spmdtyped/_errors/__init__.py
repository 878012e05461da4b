"""The error hierarchy, the code registry, message rendering, `explain` and `allow`.

Imports no JAX: the mypy plugin renders the same headlines as the runtime.  Every
``SPMD###`` code has one page in `_error_pages` / `_error_pages_boundary` / ... (pure data) and one
entry in ``REGISTRY``; the exception classes, ``st.explain``, the docs' error catalogue and
the plugin's ``spmd-<slug>`` error codes are all read from it.

A message is: the headline (naming the API, and the user's function and mesh when raised
while `st.shard_map` traces it, see `error_context`) / details / the offending axes and their
states / ``rule:`` the code's rule in one sentence / ``fix:`` as code / the opt-out of a
strict code / the docs anchor.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import functools
import re
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, ParamSpec, TypedDict, TypeVar, Unpack

from . import pages as _error_pages
from . import pages_boundary as _error_pages_boundary
from . import pages_refine as _error_pages_refine
from . import pages_report as _report_pages
from . import pages_unchecked as _error_pages_unchecked
from .pages import ErrorPage

_P = ParamSpec("_P")
_R = TypeVar("_R")

DOCS_URL = "https://spmdtyped.readthedocs.io/en/latest/errors/"


class ErrorFields(TypedDict, total=False):
    """The structured fields of an error, as `SpmdTypeError(headline, code=, **fields)` and
    `error(code, headline, **fields)` take them (each optional): the offending `axes` and their
    `states`, the `fix` as code, the raising `op`, extra `details` lines, and the user's
    `function` and `mesh` (by default those of the enclosing `error_context`)."""

    axes: Iterable[str]
    states: Mapping[str, str] | None
    fix: str | None
    op: str | None
    details: Iterable[str]
    function: str | None
    mesh: object


class SpmdTypeError(TypeError):
    """Root of every spmdtyped error: a manual-axis state mistake or bad input to spmdtyped.

    **Attributes:**

    - `code`: the `"SPMD###"` code; `st.explain(code)` prints its page.
    - `axes`: the offending mesh axes, in the order they were named.
    - `states`: `{axis: state}` of the offending value ("invariant", "varying", ...).
    - `fix`: a suggested fix as code, or `None`.
    - `op`: the spmdtyped API that raised it, or `None`.
    - `headline`: the first line of the message as the raising API wrote it (what the mypy
      plugin prints too), without the function and mesh.
    - `function`, `mesh`: the user's function and its mesh (`"dp=2, tp=4"`) when the error was
      raised while `st.shard_map` traced it, else `None`.
    - `file`, `line`, `source` (`"file:line"`): the user's line the error is about, where the
      runtime located it (the engine's violations, JAX's errors translated, a typed value's
      eager check, a face's call); else `None`, as for an error of the rules called directly
      (its traceback ends at the call).
    """

    code: str = "SPMD000"
    axes: tuple[str, ...]
    states: dict[str, str]
    fix: str | None
    op: str | None
    headline: str
    details: tuple[str, ...]
    function: str | None
    mesh: str | None
    file: str | None = None
    line: int | None = None
    source: str | None = None

    def __init__(self, headline: str, *, code: str | None = None,
                 **fields: Unpack[ErrorFields]) -> None:
        unknown = fields.keys() - ErrorFields.__annotations__.keys()
        if unknown:
            raise TypeError(f"SpmdTypeError() got unexpected keyword arguments {sorted(unknown)}")
        if code is not None:
            self.code = code
        self.headline = headline
        self.axes = tuple(fields.get("axes", ()))
        self.states = dict(fields.get("states") or {})
        self.fix = fields.get("fix")
        self.op = fields.get("op")
        self.details = tuple(fields.get("details", ()))
        ctx = _CONTEXT.get() or _NO_CONTEXT
        function, mesh = fields.get("function"), fields.get("mesh")
        self.function = function if function is not None else ctx.function
        self.mesh = describe_mesh(mesh) if mesh is not None else ctx.describe()
        super().__init__(render(self))


class AxisStateError(SpmdTypeError):
    """A collective was given a value whose state on a named axis it cannot take (SPMD1xx)."""


class CombineError(SpmdTypeError):
    """Operands of an elementwise op, matmul or reduction have states that do not combine (SPMD2xx)."""


class CastError(SpmdTypeError):
    """`pcast`/`pvary` asked for a state change no cast can make (SPMD3xx)."""


class BoundaryError(SpmdTypeError):
    """`in_specs`/`out_specs` do not fit the function's values (SPMD4xx)."""


class UsageError(SpmdTypeError):
    """Bad input to spmdtyped: unknown axis, malformed hint, call outside shard_map (SPMD5xx)."""


class CommunicationError(SpmdTypeError):
    """A step communicates more than it needs: a flag of `st.report` (SPMD7xx)."""


class InternalConsistencyError(SpmdTypeError):
    """spmdtyped predicted a different state than JAX computed: a bug in the rule table (SPMD9xx)."""


for _cls in (SpmdTypeError, AxisStateError, CombineError, CastError, BoundaryError, UsageError,
             CommunicationError, InternalConsistencyError):
    _cls.__module__ = "spmdtyped"

#: the exception class of a code, by its hundreds digit
CATEGORIES: dict[str, type[SpmdTypeError]] = {
    "1": AxisStateError, "2": CombineError, "3": CastError, "4": BoundaryError, "5": UsageError,
    "7": CommunicationError, "9": InternalConsistencyError,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ErrorInfo(ErrorPage):
    """A registry entry: a page of the catalogue (see `ErrorPage`) and its exception class."""

    @property
    def category(self) -> type[SpmdTypeError]:
        return CATEGORIES[self.code[4]]


#: the codes of the Shard / Partial refinement (`pages_refine`): JAX types these programs
#: Varying and computes the same wrong numbers with its checks on or off (`check_vma`)
WRONG_EITHER_WAY: frozenset[str] = frozenset(page.code for page in _error_pages_refine.PAGES)

REGISTRY: dict[str, ErrorInfo] = {
    page.code: ErrorInfo(**{f.name: getattr(page, f.name) for f in dataclasses.fields(page)})
    for page in sorted((*_error_pages.PAGES, *_error_pages_boundary.PAGES,
                        *_error_pages_refine.PAGES, *_error_pages_unchecked.PAGES,
                        *_report_pages.PAGES), key=lambda page: page.code)
}

_NAMES: dict[str, str] = {  # every accepted spelling (lowercase) -> code
    **{c.lower(): c for c in REGISTRY},
    **{e.mypy_code: c for c, e in REGISTRY.items()},
    **{e.slug: c for c, e in REGISTRY.items()},
}


def info(code: str | int, op: str = "st.explain") -> ErrorInfo:
    """The registry entry of `code`: `"SPMD101"`, `"spmd101"`, `101`, `"101"`, the mypy name
    `"spmd-reduced-operand"` or the slug `"reduced-operand"`; `UsageError` (SPMD508) otherwise."""
    if isinstance(code, int) and not isinstance(code, bool):
        key = f"spmd{code:03d}"
    elif isinstance(code, str):
        key = code.strip().lower()
        key = f"spmd{int(key):03d}" if re.fullmatch(r"\d{1,3}", key) else key
    else:
        raise error("SPMD508", f"{op}: an error code is a str or an int, not "
                    f"{type(code).__name__}", op=op, fix=f'{op}("SPMD101")')
    if key in _NAMES:
        return REGISTRY[_NAMES[key]]
    close = difflib.get_close_matches(key, list(_NAMES), n=5, cutoff=0.6)
    # equal scores ('spmd1o1' is as close to spmd101 as to spmd211): the most equal positions
    close.sort(key=lambda c: (-round(difflib.SequenceMatcher(None, key, c).ratio(), 6),
                              -sum(a == b for a, b in zip(c, key, strict=False))))
    hint = f"; did you mean {_NAMES[close[0]]!r} ({REGISTRY[_NAMES[close[0]]].title})?" if close else ""
    raise error("SPMD508", f"{op}: {code!r} is not an spmdtyped error code{hint}", op=op,
                fix=f"{op}({_NAMES[close[0]]!r})" if close else "python -m spmdtyped explain   "
                "# lists every code")


# ----------------------------------------------------------------------------- context


@dataclasses.dataclass(frozen=True)
class _Context:
    function: str | None = None
    mesh: object = None
    manual: tuple[str, ...] | None = None

    def describe(self) -> str | None:
        return None if self.mesh is None else describe_mesh(self.mesh, self.manual)


_NO_CONTEXT = _Context()
_CONTEXT: contextvars.ContextVar[_Context | None] = contextvars.ContextVar(
    "spmdtyped_error_context", default=None
)


def describe_mesh(mesh: object, manual: Iterable[str] | None = None) -> str:
    """`"dp=2, tp=4"` for a mesh (anything with a `shape` mapping, or a mapping itself), with
    `"; manual: dp"` when only some of its axes are manual; a str is kept as it is."""
    if isinstance(mesh, str):
        return mesh
    shape = mesh if isinstance(mesh, Mapping) else getattr(mesh, "shape", None)
    if not isinstance(shape, Mapping):
        return repr(mesh)
    out = ", ".join(f"{a}={n}" for a, n in shape.items())
    manual = tuple(manual) if manual is not None else None
    if manual is not None and set(manual) != set(shape):
        out += f"; manual: {', '.join(manual)}"
    return out


class error_context:  # lowercase: used like a function, `with error_context(...)`
    """Name the user's function and mesh in every spmdtyped error raised inside the block.

    `st.shard_map` and `st.adapters.typed_shard_map` apply it (as a decorator) to the function
    they return, so a message raised while the body is traced reads
    `st.psum over 'tp' in mlp (mesh dp=2, tp=4): ...`. Costs one context-variable set per call.

    **Arguments:**

    - `function`: the function's name.
    - `mesh`: a `jax.sharding.Mesh` (or a `{axis: size}` mapping, or a ready string); it is
      only described when an error is built.
    - `manual`: the manual axes, when only some of the mesh's axes are manual.

    !!! Example
        ```python
        with error_context(function="mlp", mesh=mesh):
            ...
        ```
    """

    __slots__ = ("_ctx", "_tokens")

    def __init__(self, *, function: str | None = None, mesh: object = None,
                 manual: Iterable[str] | None = None) -> None:
        self._ctx = _Context(function, mesh, tuple(manual) if manual is not None else None)
        self._tokens: list[contextvars.Token[_Context | None]] = []

    def __enter__(self) -> None:
        self._tokens.append(_CONTEXT.set(self._ctx))

    def __exit__(self, *exc: object) -> None:
        _CONTEXT.reset(self._tokens.pop())

    def __call__(self, fn: Callable[_P, _R]) -> Callable[_P, _R]:
        ctx = self._ctx

        @functools.wraps(fn)
        def in_context(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            token = _CONTEXT.set(ctx)
            try:
                return fn(*args, **kwargs)
            finally:
                _CONTEXT.reset(token)

        return in_context


def _where(err: SpmdTypeError, head: str) -> str:
    """` in mlp (mesh dp=2, tp=4)` (the function left out where `head` already names it)."""
    parts = []
    if err.function is not None and f"({err.function})" not in head:
        parts.append(f"in {err.function}")
    if err.mesh is not None:
        parts.append(f"(mesh {err.mesh})")
    return " ".join(parts)


# ----------------------------------------------------------------------------- messages


def error(code: str, headline: str, **fields: Unpack[ErrorFields]) -> SpmdTypeError:
    """Build (not raise) the exception of `code`'s category (noted, with the lines of the
    Python stack, while `built_errors()` collects)."""
    built = _BUILT.get()
    if built is not None:
        built.append((code, frozenset((f.filename, f.lineno or 0)
                                      for f in traceback.extract_stack())))
    return REGISTRY[code].category(headline, code=code, **fields)


#: the exception classes of JAX's that an error raised in place of JAX's also is (`raised_as`):
#: Python's own, which `except` clauses around a `jax.shard_map` call name, of the plain
#: exception layout and message (not NameError, whose `name` field an SpmdTypeError cannot
#: share, nor KeyError, which quotes its message); not JAX's internal assertions
_KEPT_CLASSES = (ValueError, TypeError, IndexError, NotImplementedError)
#: JAX's own classes kept as well, by module and name: its error for a replicated input mixed
#: with a reduced one (not exported; JAX's `pjit_test.py` asserts it around a shard_map)
_KEPT_JAX_CLASSES = frozenset({("jax._src.core", "ShardingTypeError")})
#: (category, JAX's class) -> the category that is also JAX's class (`raised_as`)
_AS_JAX: dict[tuple[type[SpmdTypeError], type[Exception]], type[SpmdTypeError]] = {}


def jax_class(e: BaseException) -> type[Exception] | None:
    """The exception class JAX raised where `e` was raised: `e`'s own for JAX's exception,
    the class an error raised in its place keeps (`raised_as`); None for an error of
    spmdtyped's own finding, or a class `raised_as` does not keep."""
    if isinstance(e, SpmdTypeError):
        return getattr(type(e), "jax_class", None)
    cls = type(e)
    if (cls.__module__, cls.__qualname__) in _KEPT_JAX_CLASSES and issubclass(cls, Exception):
        return cls
    return cls if cls.__module__ == "builtins" and issubclass(cls, _KEPT_CLASSES) \
        and cls.__basicsize__ == TypeError.__basicsize__ else None


def raised_as(err: SpmdTypeError, jax_error: BaseException | None) -> SpmdTypeError:
    """`err`, raised in place of `jax_error` (JAX's exception, or an SpmdTypeError raised in
    place of one), made an instance of JAX's class too (`jax_class`): a drop-in's
    `except ValueError:` around the call keeps catching what JAX raised there (JAX's in_specs
    and out_specs errors and its collectives' state errors are ValueErrors; spmdtyped's are
    TypeErrors). Its category, code and fields are unchanged."""
    kept = None if jax_error is None else jax_class(jax_error)
    if kept is None or isinstance(err, kept):
        return err
    base = type(err)
    if getattr(base, "jax_class", None) is not None:   # (one class JAX's: the base's)
        base = base.__mro__[1]
    try:
        err.__class__ = _as_jax(base, kept)
    except TypeError:   # (a layout `jax_class` did not foresee: the error stands as it is)
        pass
    return err


def _as_jax(base: type[SpmdTypeError], kept: type[Exception]) -> type[SpmdTypeError]:
    """The class `base` and `kept` (`raised_as`), made once; named and documented as `base`."""
    cls = _AS_JAX.get((base, kept))
    if cls is None:
        cls = _AS_JAX[(base, kept)] = type(base.__name__, (base, kept), {
            "__module__": base.__module__, "__qualname__": base.__qualname__,
            "__doc__": base.__doc__, "jax_class": kept, "__reduce__": _reduce})
    return cls


def _reduce(self: SpmdTypeError) -> tuple[Any, ...]:
    """Pickle an error `raised_as` made (its class is no module's attribute): by its category
    and JAX's class."""
    cls = type(self)
    return (_rebuilt, (cls.__mro__[1], cls.jax_class, self.args), self.__dict__)  # type: ignore[attr-defined]


def _rebuilt(base: type[SpmdTypeError], kept: type[Exception], args: tuple[Any, ...]
             ) -> SpmdTypeError:
    cls = _as_jax(base, kept)
    err = cls.__new__(cls, *args)
    err.args = args
    return err


#: `(code, {(file, line) of the stack}) for each error built while `built_errors()` is active
_BUILT: contextvars.ContextVar[list[tuple[str, frozenset[tuple[str, int]]]] | None] = \
    contextvars.ContextVar("spmdtyped_built_errors", default=None)


@contextlib.contextmanager
def built_errors() -> Iterator[list[tuple[str, frozenset[tuple[str, int]]]]]:
    """The errors built (by a typed value's check) while a face traces a body: one the body
    caught itself (`try: ... except st.SpmdTypeError:`) left its equations in the program, and
    the engine does not report them again (`_engine.check`)."""
    got: list[tuple[str, frozenset[tuple[str, int]]]] = []
    token = _BUILT.set(got)
    try:
        yield got
    finally:
        _BUILT.reset(token)


def render(err: SpmdTypeError) -> str:
    """The message: headline (+ function and mesh) / details / axis states / rule / fix (the
    raising API's, else the page's as an example) / opt-out / docs anchor."""
    entry = REGISTRY.get(err.code)
    head, sep, rest = err.headline.partition(": ")
    where = _where(err, head if sep else err.headline)
    lines = []
    if where and sep and err.op is not None and head.startswith(err.op.split("(")[0]):
        lines.append(f"{head} {where}: {rest}  [{err.code}]")
    else:
        lines.append(f"{err.headline}  [{err.code}]")
        if where:
            lines.append(f"  {where}")
    lines.extend(f"  {d}" for d in err.details)
    for axis in err.axes:
        if axis in err.states:
            lines.append(f"  axis {axis!r}: the value is {err.states[axis]}")
    if entry is not None:
        lines.append(f"  rule: {entry.rule}")
    if err.fix:
        lines.append(f"  fix: {err.fix}")
    elif entry is not None:  # the raising API has no fix of its own: the page's, as an example
        lines.append(f"  fix (example): {entry.fix}")
    if entry is not None:
        if entry.opt_out:
            lines.append(f"  opt-out: with st.allow({entry.code!r}): ...")
        lines.append(f"  docs: {DOCS_URL}{entry.code}/  (python -m spmdtyped explain {entry.code})")
    return "\n".join(lines)


def explain(code: str | int) -> str:
    """The full catalogue page of an error code, as Markdown.

    **Arguments:**

    - `code`: `"SPMD101"` (any case), `101`, the mypy error code `"spmd-reduced-operand"` or
      its slug `"reduced-operand"`.

    **Returns:** the page: headline, rule, the wrong code and the fixed code, what it means,
    the fix and other solutions, when it happens, the opt-out of a strict code, related errors.

    **Raises:** `UsageError` (SPMD508) for an unknown code, naming the closest known one.

    !!! Example
        ```python
        print(st.explain("SPMD101"))
        ```
    """
    e = info(code)
    out = [f"# {e.code}: {e.title}", "", f"{e.headline[0].upper()}{e.headline[1:]}.", "",
           f"**Rule:** {e.rule}", "", f"mypy error code: `{e.mypy_code}`  ",
           f"category: `spmdtyped.{e.category.__name__}`", "",
           "## Example fix", "", f"Wrong (raises {e.code}):", "", "```python", e.before, "```", "",
           "Fixed:", "", "```python", e.after, "```", "",
           "## What it means", "", e.meaning, "",
           "## Solutions", "", "Fix:", "", "```python", e.fix, "```", ""]
    out.extend(f"{i}. {s}" for i, s in enumerate(e.solutions, 1))
    out += ["", "## When it happens", "", e.when, ""]
    if e.opt_out:
        out += ["## Opt-out", "", "JAX accepts this program (and computes a wrong or surprising "
                "result). To get JAX's behaviour for a block of code:", "", "```python",
                f"with st.allow({e.code!r}):", "    ...", "```", ""]
    if e.related:
        out += ["## Related errors", ""]
        out.extend(f"- {r}: {REGISTRY[r].title}" for r in e.related)
        out.append("")
    return "\n".join(out)


# ----------------------------------------------------------------------------- opt-outs

_ALLOWED: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "spmdtyped_allowed", default=frozenset()
)


@contextlib.contextmanager
def allow(*codes: str | int) -> Iterator[None]:
    """Opt out of spmdtyped's strict rules (those where JAX accepts and is wrong) in a block.

    **Arguments:**

    - `*codes`: strict codes, e.g. `"SPMD103"` (collective on an Invariant axis) or
      `"SPMD202"` (non-linear op on an Unreduced value); any spelling `st.explain` takes.

    Inside the block spmdtyped follows JAX's own behaviour for those codes.

    **Raises:** `UsageError` (SPMD508) if a code is unknown or not a strict rule.

    !!! Example
        ```python
        with st.allow("SPMD103"):
            y = st.psum(x, "dp")   # n * x, as JAX computes it
        ```
    """
    entries = [info(c, "st.allow") for c in codes]
    for c, e in zip(codes, entries, strict=True):
        if not e.opt_out:
            strict = sorted(k for k, v in REGISTRY.items() if v.opt_out)
            raise error("SPMD508", f"st.allow: {c!r} is not a strict rule that can be opted out of; "
                        f"strict codes: {', '.join(strict)}", op="st.allow",
                        fix=f"with st.allow({strict[0]!r}): ...")
    allowed_now = frozenset(e.code for e in entries)
    token = _ALLOWED.set(_ALLOWED.get() | allowed_now)
    try:
        with contextlib.ExitStack() as scopes:
            for hook in ALLOW_SCOPES:   # the engine marks the equations traced in the block
                scopes.enter_context(hook(allowed_now))
            yield
    finally:
        _ALLOWED.reset(token)


#: context managers entered by `allow(...)` with its codes: the JAX layer registers one that
#: names the equations traced inside the block (`_engine.check`), so that the jaxpr walk,
#: which runs after the trace, honours an opt-out written in the body
ALLOW_SCOPES: list[Callable[[frozenset[str]], contextlib.AbstractContextManager[None]]] = []


def allowed(code: str) -> bool:
    """Whether `code` is opted out of (`st.allow`) where this runs."""
    return code in _ALLOWED.get()


def allowed_codes() -> frozenset[str]:
    """The codes opted out of (`st.allow`) where this runs."""
    return _ALLOWED.get()
