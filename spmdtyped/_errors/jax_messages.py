"""JAX's manual-axis errors, translated: each message JAX raises about manual-axis types (jax
0.10 and 0.12) maps to an SPMD code, with the user's line, the operand states JAX printed and
the fix; JAX's exception is chained (`raise ... from jax_error`), and the error is of JAX's
exception class too (`raised_as`: a `ValueError` where JAX raised one).

`TABLE` is the map (one row per JAX message; docs/porting.md prints it); `translate(e)` returns
the SpmdTypeError for a JAX exception, or None when the message is not a manual-axis error;
`jax_errors(where, op)` is the context manager `st.shard_map`, `typed_shard_map`, `infer` and
`spmdtyped.lax` wrap their tracing in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import linecache
import re
import traceback
from collections.abc import Iterator

from .. import _compat, _surface
from .._frames import in_package_note, innermost_user, package_call_site
from .._rules.axis_ops import AXIS_OPS
from . import SpmdTypeError, error, raised_as


@dataclasses.dataclass(frozen=True)
class JaxMessage:
    """One message JAX raises about manual-axis types, and its SPMD code."""

    #: a regular expression matched against the first lines of JAX's message
    pattern: str
    code: str
    #: a message JAX raises, as the docs show it
    example: str
    #: what went wrong, in spmdtyped's words ({op}: the primitive JAX named, when it names one)
    headline: str
    fix: str
    #: where JAX raises it (file in jax/_src); "0.12" when only jax 0.12 has it
    versions: str = "0.10, 0.12"


#: the fix of a loop carry that leaves the body more varying than it came in: a value that
#: varies for real (the carry's initial state is too narrow), or partial sums that lack their
#: reduction (a row-parallel projection without its psum: the cast would hide the bug)
_CARRY_FIX = ("if the body's value holds partial sums over the axes it gained (a row-parallel "
              "projection), psum it in the body; if it really varies there, give the initial "
              "carry that state: jax.lax.pcast(init, axes, to='varying')")

TABLE: tuple[JaxMessage, ...] = (
    JaxMessage(r"(?P<op>\w+) cannot accept args which are reduced",
               "SPMD101", "psum cannot accept args which are reduced. Got f32[4]{R:dp} and axes={'dp'}",
               "{op} over an axis on which its input is Reduced (already reduced: replicated)",
               'cast it back first: jax.lax.pcast(x, axis, to="varying"), or use the value from '
               "before the reduction"),
    JaxMessage(r"(?P<op>pvary) cannot accept args which are unreduced",
               "SPMD201", "pvary cannot accept args which are unreduced. Got f32[4,2]{V:dp, U:tp} "
               "and axes={'tp'}",
               "an Unreduced value combined with a value that varies over its unreduced axes "
               "(JAX would have to pvary the partial sums)",
               "finish the reduction first: jax.lax.psum(x, axis), then combine"),
    JaxMessage(r"(?P<op>\w+) cannot accept args which are unreduced",
               "SPMD102", "ppermute cannot accept args which are unreduced. Got f32[4]{U:tp} and axes={'tp'}",
               "{op} over an axis on which its input is Unreduced (partial sums)",
               "finish the reduction first: jax.lax.psum(x, axis) (or psum_scatter)"),
    JaxMessage(r"(?P<op>all_gather_reduced) (?:only accepts inputs that are varying|is a "
               r"Varying -> Reduced collective)",
               "SPMD103", "all_gather_reduced only accepts inputs that are varying. Got f32[4,2]",
               "jax.lax.all_gather(to='reduced') of a value that is Invariant over the axis "
               "(it gathers the shards of a Varying value)",
               "drop the gather if x is already whole on every device (jax.lax.pcast(x, axis, "
               "to='reduced') types it Reduced); else gather the value from before the reduction"),
    JaxMessage(r"(?P<op>all_gather_reduced)'s input cannot be reduced",
               "SPMD101", "all_gather_reduced's input cannot be reduced across the axis_name "
               "provided. Got x=... and axis_name=...",
               "jax.lax.all_gather(to='reduced') of a value that is already Reduced over the axis",
               "drop the gather: the value is already gathered (Reduced) over the axis"),
    JaxMessage(r"(?P<op>\w+) cannot accept args with unreduced_kind",
               "SPMD106", "psum cannot accept args with unreduced_kind=... Expected unreduced_kind=...",
               "{op} was given an Unreduced value of another unreduced kind (sum vs max/min)",
               "reduce with the collective of the value's kind (psum for sum, pmax for max, ...)"),
    JaxMessage(r"can only accept axis_name which corresponds to one of",
               "SPMD104", "psum can only accept axis_name which corresponds to one of varying, "
               "unreduced, reduced or invariant ...",
               "a collective over several axes got a value whose state differs between them",
               "call the collective once per group of axes with the same state"),
    JaxMessage(r"unreduced/reduced rule for (?P<op>\w+) is not implemented",
               "SPMD202", "unreduced/reduced rule for cumsum is not implemented. Please file an "
               "issue ...",
               "{op} has no rule for an Unreduced (partial sum) or Reduced operand (jax 0.12.1 "
               "rejects it; earlier versions silently dropped the state)",
               "psum an Unreduced input first: {op}(jax.lax.psum(x, axis)); cast a Reduced one "
               "to Varying first: {op}(jax.lax.pcast(x, axis, to='varying'))", "0.12.1"),
    # (the same message for a Reduced operand alone: `translate` tells them apart by the
    # operands JAX rejected, `_compat.rejected_operands`)
    JaxMessage(r"unreduced/reduced rule for (?P<op>\w+) is not implemented",
               "SPMD203", "unreduced/reduced rule for cumsum is not implemented. Please file an "
               "issue ... (the operand Reduced)",
               "{op} has no rule for a Reduced operand (jax 0.12.1 rejects it; earlier "
               "versions silently dropped the state)",
               "cast the value to Varying first: {op}(jax.lax.pcast(x, axis, to='varying'))",
               "0.12.1"),
    JaxMessage(r"(?P<op>\w+) cannot accept unreduced inputs",
               "SPMD202", "sort cannot accept unreduced inputs. Got ['float32[4]{U:dp}']",
               "{op} is not linear, and its input is Unreduced (a partial sum)",
               "psum the input first: {op}(jax.lax.psum(x, axis))", "0.12.1"),
    JaxMessage(r"(?P<op>pad) operand and padding_value must be unreduced along the same",
               "SPMD202", "pad operand and padding_value must be unreduced along the same mesh "
               "axes and have the same unreduced_kind. Got operand=float32[4]{U:tp} and "
               "padding_value=float32[]",
               "pad of an Unreduced value with a padding value that is not Unreduced on the "
               "same axes (jnp.pad's constant is Invariant)",
               "pad after the reduction: jnp.pad(jax.lax.psum(x, axis), ...); or jax.lax.pad "
               "with a padding value Unreduced on the same axes", "0.12.1"),
    JaxMessage(r"(?P<op>pad) operand and padding_value must be reduced along the same",
               "SPMD203", "pad operand and padding_value must be reduced along the same mesh "
               "axes. Got operand=float32[4]{R:tp} and padding_value=float32[]",
               "pad of a Reduced value with a padding value that is not Reduced on the same "
               "axes (jnp.pad's constant is Invariant)",
               "pad the value cast to Varying: jnp.pad(jax.lax.pcast(x, axis, to='varying'), "
               "...); or jax.lax.pad with a padding value Reduced on the same axes", "0.12.1"),
    JaxMessage(r"(?P<op>dynamic_(?:update_)?slice) start_indices cannot be varying when operand",
               "SPMD205", "dynamic_slice start_indices cannot be varying when operand has "
               "unreduced or reduced axes. Got start_indices=(ShapedArray(int32[]{V:dp}),)",
               "{op} at a start index that varies, of a value that is Unreduced or Reduced",
               "cast a Reduced value to Varying first (jax.lax.pcast(x, axis, to='varying')); "
               "psum an Unreduced one first", "0.12"),
    JaxMessage(r"unreduced rule for (?P<op>\w+) is not implemented",
               "SPMD202", "unreduced rule for tanh is not implemented. Please file an issue ...",
               "{op} is not linear, and its input is Unreduced (a partial sum)",
               "psum the input first: {op}(jax.lax.psum(x, axis)); or declare a linear custom op"),
    JaxMessage(r"(?P<op>\w+) is a non-linear operation and cannot accept input that is unreduced",
               "SPMD202", "tanh is a non-linear operation and cannot accept input that is "
               "unreduced. Got float32[4,2]...",
               "{op} is not linear, and its input is Unreduced (a partial sum)",
               "psum the input first: {op}(jax.lax.psum(x, axis)); or declare a linear custom op",
               "0.12"),
    JaxMessage(r"lhs and rhs to `mul` cannot be unreduced",
               "SPMD202", "lhs and rhs to `mul` cannot be unreduced since mul is bilinear. ...",
               "a product of two Unreduced values (Σa · Σb is not Σ(a·b))",
               "psum one of the factors first: x * jax.lax.psum(y, axis)"),
    JaxMessage(r"lhs or rhs passed to dot_general cannot be unreduced",
               "SPMD202", "lhs or rhs passed to dot_general cannot be unreduced. Got lhs=... and rhs=...",
               "a matmul of an Unreduced value with a value that is not Reduced on its axes",
               "psum the Unreduced operand first, or make the other operand Reduced "
               "(jax.lax.pcast(w, axis, to='reduced'))"),
    JaxMessage(r"(?:RHS|LHS) should be reduced along the same axes (?:LHS|RHS) is unreduced on",
               "SPMD201", "RHS should be reduced along the same axes LHS is unreduced on. Got "
               "lhs=float32[4,2]{V:dp, U:tp} and rhs=float32[]{V:dp}",
               "an Unreduced value multiplied by a factor that is not Reduced on its unreduced "
               "axes (a constant too: JAX types it Invariant)",
               "scale after the reduction: jax.lax.psum(u, axis) * c; or cast the factor: "
               "u * jax.lax.pcast(jnp.asarray(c, u.dtype), axis, to='reduced')"),
    JaxMessage(r"denominator cannot be unreduced",
               "SPMD202", "The denominator cannot be unreduced passed to `div`. Got y=...",
               "division by an Unreduced value (1/Σb is not Σ(1/b))",
               "psum the denominator first: x / jax.lax.psum(y, axis)", "0.12"),
    JaxMessage(r"scatter indices cannot be unreduced",
               "SPMD202", "scatter indices cannot be unreduced. Got indices sharding ...",
               "scatter indices that are Unreduced (partial sums of indices)",
               "psum the indices first", "0.12"),
    JaxMessage(r"Inputs cannot be replicated on the same axes that another input",
               "SPMD203", "Inputs cannot be replicated on the same axes that another input is "
               "reduced on. Got ...",
               "a Reduced value combined with a value that is Invariant on its reduced axes",
               "make the other operand Reduced too (jax.lax.pcast(y, axis, to='reduced')) or "
               "Varying (jax.lax.pcast(y, axis, to='varying'))"),
    JaxMessage(r"All inputs should be reduced across the same mesh axes",
               "SPMD204", "All inputs should be reduced across the same mesh axes. Got specs: ...",
               "operands Reduced on different axes",
               "cast the operands to the same Reduced axes first"),
    JaxMessage(r"(?P<op>\w+) input cannot be unreduced across the axis_name",
               "SPMD301", "vary_unreduced_cast input cannot be unreduced across the axis_name ...",
               "pcast of a value that is already Unreduced on the axis",
               "drop the cast: the value is already Unreduced"),
    JaxMessage(r"Unsupported pcast from=(?P<op>\w+), to=",
               "SPMD301", "Unsupported pcast from=unreduced, to='unreduced'",
               "pcast cannot make this state change (the value is {op})",
               "the free casts are Invariant -> Varying/Reduced, Reduced -> Varying and "
               "Varying -> Unreduced; out of Unreduced only jax.lax.psum leads"),
    JaxMessage(r"(?P<op>vary_unreduced_cast) is a Varying->Unreduced collective",
               "SPMD401", "vary_unreduced_cast is a Varying->Unreduced collective. This means "
               "that the axis names mentioned in `axes` passed to `vary_unreduced_cast` must be "
               "present in `jax.typeof(x).mat.varying`. Got axes=('tp',) and ...",
               "an output that is not Varying over an axis its out_spec says is Unreduced (at "
               "the boundary only a Varying value becomes partial sums)",
               "return the value before its reduction, or drop the axis from the out_spec's "
               "unreduced="),
    JaxMessage(r"Primitive (?P<op>\w+) requires varying manual axes to match",
               "SPMD205", "Primitive foo requires varying manual axes to match, but got "
               "[{'dp'}, set()] ...",
               "{op} has no rule for operands that vary over different manual axes",
               "make the operands agree: jax.lax.pcast(x, axes, to='varying') on the one that "
               "varies over fewer axes"),
    JaxMessage(r"Scan carry input and output got mismatched varying manual axes",
               "SPMD302", "Scan carry input and output got mismatched varying manual axes for "
               "carry ...",
               "a loop carry enters in one state and leaves the body in another",
               _CARRY_FIX),
    JaxMessage(r"scan body function carry input and carry output must have equal types"
               r".*(?:\{[VUR]:|varying|vma)",
               "SPMD302", "scan body function carry input and carry output must have equal types, "
               "but they differ: ... f32[4]{V:dp} ... f32[4]",
               "a loop carry enters in one state and leaves the body in another",
               _CARRY_FIX),
    # typed values are pytrees whose class is their state: jax.lax's control flow compares a
    # typed carry's (or branch output's) class as part of its pytree structure
    JaxMessage(r"(?P<op>scan|while_loop) body function carry input and carry output must have "
               r"the same pytree structure.*<class 'spmdtyped\.\w+\[.*<class 'spmdtyped\.\w+\[",
               "SPMD302", "scan body function carry input and carry output must have the same "
               "pytree structure, but they differ: ... The input carry c is a <class "
               "'spmdtyped.Varying['dp']'> but the corresponding component of the carry output "
               "is a <class 'spmdtyped.Varying['dp', 'tp']'> ...",
               "a loop carry enters in one state and leaves the body in another (jax.lax.{op} "
               "compares a typed carry's class, which is its state)",
               "use st.scan / st.fori_loop / st.while_loop, which cast the initial carry for "
               "free; or " + _CARRY_FIX),
    JaxMessage(r"(?P<op>cond|switch)? ?branch outputs must have the same pytree structure"
               r".*<class 'spmdtyped\.\w+\[.*<class 'spmdtyped\.\w+\[",
               "SPMD302", "cond branch outputs must have the same pytree structure, but they "
               "differ: ... true_fun output is a <class 'spmdtyped.Varying['dp', 'tp']'> but "
               "false_fun output is a <class 'spmdtyped.Varying['dp']'> ...",
               "the branches of cond/switch return values in different states (jax.lax compares "
               "a typed value's class, which is its state)",
               "use st.cond / st.switch, which join the branches' states, or cast the branch "
               "outputs to one state: jax.lax.pcast(y, axes, to='varying')"),
    JaxMessage(r"(?:carry input and carry output|branch outputs) must have the same pytree "
               r"structure.*<class 'spmdtyped\.\w+\[",
               "SPMD509", "scan body function carry input and carry output must have the same "
               "pytree structure, but they differ: ... The input carry c is a <class "
               "'spmdtyped.Varying['dp']'> but the corresponding component of the carry output "
               "is a <class 'jax._src.core.ShapedArray'> ...",
               "a typed value and a raw one meet in a jax.lax loop carry or cond branch: "
               "jax.lax compares their pytree structure, and a typed value is a pytree node "
               "around its array (a jnp or jax.nn call on a typed value returns a raw one)",
               "give jax.lax's control flow raw values: st.unwrap(x) (the engine still checks "
               "the program), or use st.scan / st.fori_loop / st.while_loop / st.cond, which "
               "take typed and raw values alike"),
    JaxMessage(r"cond branches must have equal output types.*(?:\{[VUR]:|varying|vma)",
               "SPMD302", "cond branches must have equal output types but they differ. ... "
               "f32[4]{V:dp} ... f32[4]",
               "the branches of cond/switch return values in different states",
               "cast the branch outputs to the same state: jax.lax.pcast(y, axes, to='varying')"),
    JaxMessage(r"branches of cond produced mismatched varying manual",
               "SPMD302", "The branches of cond produced mismatched varying manual axes ...",
               "the branches of cond/switch return values in different states",
               "cast the branch outputs to the same state: jax.lax.pcast(y, axes, to='varying')",
               "0.12"),
    JaxMessage(r"Primitive (?P<op>\w+) requires the value's varying manual axes to match",
               "SPMD302", "Primitive swap requires the value's varying manual axes to match "
               "the Ref's ...",
               "a Ref was written with a value in another state than the Ref's",
               "cast the value to the Ref's state before writing it", "0.12"),
    JaxMessage(r"out_specs passed to shard_map should be equal to the (?:unreduced|reduced)",
               "SPMD401", "out_specs passed to shard_map should be equal to the unreduced present "
               "on the out_aval. Got out_specs=... and out_aval=...",
               "an output's Unreduced/Reduced state differs from its out_spec's",
               "psum the output, or declare P(unreduced={{...}}) / P(reduced={{...}}) as it is"),
    JaxMessage(r"out_specs which require replication which can't be statically",
               "SPMD401", "shard_map applied to the function 'f' was given out_specs which "
               "require replication which can't be statically inferred given the mesh ...",
               "an output varies over an axis its out_spec says it is replicated on",
               "psum/pmean/all_gather it over that axis, or name the axis in out_specs"),
    JaxMessage(r"in_specs containing (?:unreduced|reduced|unreduced_kind) .* passed to shard_map",
               "SPMD403", "in_specs containing unreduced P(unreduced={'tp'}) passed to shard_map "
               "should be equal to the unreduced present on the in_aval ...",
               "an argument's Unreduced/Reduced sharding differs from its in_spec",
               "shard the argument as its spec says (jax.device_put with NamedSharding(mesh, spec))"),
    JaxMessage(r"(?:unreduced|reduced) in (?:in|out)_specs .* can only be used when the mesh",
               "SPMD403", "unreduced in in_specs P(unreduced={'tp'}) can only be used when the "
               "mesh passed to shard_map contains axis names of type `Manual`",
               "an Unreduced/Reduced spec on an axis that is not manual in this shard_map",
               "make the axis manual (drop axis_names) or drop the unreduced/reduced spec"),
    JaxMessage(r"unexpected JAX type \(e\.g\. shape/dtype\) for argument to VJP function: got "
               r"(\w+\[[^\]]*\])\S*, but expected \1\{",
               "SPMD404", "unexpected JAX type (e.g. shape/dtype) for argument to VJP function: got "
               "float32[4,8]{V:(dp,tp)}, but expected float32[4,8]{V:dp, U:tp} ...",
               "a cotangent given to a vjp pullback is not in the state of its output's "
               "cotangent (a Reduced output needs an Unreduced one: the pullback of "
               "all_gather(to='reduced') is unreduced_psum_scatter)",
               "give the cotangent the output's state with Unreduced and Reduced swapped: "
               "jax.lax.pcast(ct, axis, to='unreduced') for a Reduced output"),
    JaxMessage(r"(?P<op>unreduced_psum_scatter)(?: only accepts inputs that are unreduced|'s "
               r"input cannot be varying| is a Unreduced -> Varying collective)",
               "SPMD404", "unreduced_psum_scatter only accepts inputs that are unreduced. Got "
               "f32[4,8]{V:(dp,tp)}",
               "unreduced_psum_scatter (the pullback of all_gather(to='reduced')) got a "
               "cotangent that is not Unreduced over the axis",
               "give the cotangent the output's state with Unreduced and Reduced swapped: "
               "jax.lax.pcast(ct, axis, to='unreduced') for a Reduced output"),
    JaxMessage(r"unbound axis name: (?P<op>\S+)",
               "SPMD501", "unbound axis name: dq",
               "a collective names an axis that is not a manual axis of the enclosing shard_map",
               "use one of the mesh's axis names (or add it to axis_names)"),
)

#: a call of a collective (not a cast) on a source line: the collective table's names
_COLLECTIVE_CALL = r"\b(" + "|".join(
    c.name for c in _surface.COLLECTIVES
    if c.ops and not all(AXIS_OPS[op].is_cast for op in c.ops)) + r")\s*\("
_UNREDUCED_COLLECTIVE = next(r for r in TABLE if r.code == "SPMD102")
_IMPLICIT_PVARY = next(r for r in TABLE if r.pattern.startswith("(?P<op>pvary)"))
_UNREDUCED_OUT = next(r for r in TABLE if r.pattern.startswith("(?P<op>vary_unreduced_cast) is"))
_UNSUPPORTED_PCAST = next(r for r in TABLE if r.pattern.startswith("Unsupported pcast"))
_NO_RULE, _NO_RULE_REDUCED = (r for r in TABLE if r.pattern.startswith("unreduced/reduced rule"))

def _user_frames(e: BaseException
                 ) -> tuple[tuple[str, int] | None, tuple[str, int] | None, str | None]:
    """The innermost frame of the traceback outside JAX, spmdtyped and the standard library;
    the frame the error names (the same, or the user's line that called into an installed
    package, flax's `nn.scan` or optax, when the first is that package's:
    `_frames.package_call_site`); and then a detail with the package's line."""
    frames = [(fs.filename, fs.lineno or 0, fs.name)
              for fs in reversed(traceback.extract_tb(e.__traceback__))]
    inner = innermost_user(frames)
    site = None if inner is None else package_call_site(frames, inner)
    if inner is None or site is None:
        return inner, inner, None
    return inner, site[:2], in_package_note(inner, site[2])


def translate(e: BaseException, where: str | None = None) -> SpmdTypeError | None:
    """The SpmdTypeError for JAX's manual-axis exception `e` (None for any other exception).

    The error has `.jax_message` (JAX's own text), `.file`/`.line`/`.source` (the user's frame
    in `e`'s traceback, when there is one) and the states JAX printed in `details`."""
    if isinstance(e, SpmdTypeError):
        return None
    text = str(e)
    head = "\n".join(text.splitlines()[:40])
    for row in TABLE:
        m = re.search(row.pattern, head, re.DOTALL)
        if m is None:
            continue
        op = m.groupdict().get("op") or "the operation"
        inner, frame, inside = _user_frames(e)
        if row is _IMPLICIT_PVARY and inner is not None:
            # JAX's implicit pvary of an Unreduced value: a collective needing a Varying input
            # (SPMD102) or an op combining it with a Varying value (SPMD201); the user's line
            # tells which
            call = re.search(_COLLECTIVE_CALL, linecache.getline(*inner))
            if call is not None:
                row, op = _UNREDUCED_COLLECTIVE, call.group(1)
        if row is _UNREDUCED_OUT and inner is not None and "pcast" in linecache.getline(*inner):
            # the user's own cast, not the boundary's
            row, op = _UNSUPPORTED_PCAST, "not Varying"
        if row is _NO_RULE:
            # one message for both states: the operands JAX's rule rejected tell which
            rejected = _compat.rejected_operands(e)
            if rejected is not None and rejected[1] and not rejected[0]:
                row = _NO_RULE_REDUCED
        states = re.findall(r"\w+\[[^\]]*\]\{[^}]*\}", head)
        details = [f"JAX: {text.splitlines()[0][:300]}"]
        if states:
            details.append("operand states (JAX): " + ", ".join(dict.fromkeys(states)))
        typed = re.findall(r"<class 'spmdtyped\.(\w+\[[^\]]*\])'>", head)
        if typed:
            details.append("typed values (JAX's message): " + ", ".join(typed))
        if inside is not None:
            details.append(inside)
        if frame is not None:
            details.append(f"at {frame[0]}:{frame[1]}")
        prefix = f"{where}: " if where else ""
        err = error(row.code, prefix + row.headline.format(op=op), op=op,
                    fix=row.fix.format(op=op), details=tuple(details))
        err.jax_message = text  # type: ignore[attr-defined]
        if frame is not None:
            err.file, err.line = frame
            err.source = f"{frame[0]}:{frame[1]}"
        return err
    return None


#: JAX's errors that are not about manual axes but that typed values can cause, each with the
#: note `jax_errors` adds to JAX's exception (raised as it is)
TYPED_VALUE_NOTES: tuple[tuple[str, str], ...] = (
    (r"Custom JVP rule \S+ for function \S+ must produce primal and tangent outputs with equal "
     r"container \(pytree\) structures.*CustomNode\((?:Invariant|Varying|Unreduced|Reduced)\b",
     "spmdtyped: the custom_jvp rule got typed primals and tangents (typed values are pytrees) "
     "and returned a typed value on one side and a raw one on the other (a jnp call on a typed "
     "value returns a raw one). Return raw values on both sides: st.unwrap(t) for the typed "
     "one (it returns a raw value as it is). See docs/runtime.md."),
)


def typed_value_note(e: BaseException) -> str | None:
    """The note for a JAX error typed values caused (`TYPED_VALUE_NOTES`), or None."""
    head = "\n".join(str(e).splitlines()[:5])
    return next((note for pattern, note in TYPED_VALUE_NOTES
                 if re.search(pattern, head, re.DOTALL)), None)


@contextlib.contextmanager
def jax_errors(where: str | None = None) -> Iterator[None]:
    """Raise JAX's manual-axis errors inside the block as SpmdTypeErrors (JAX's chained); a
    JAX error typed values caused otherwise is raised as it is, with a note that says how
    (`typed_value_note`)."""
    try:
        yield
    except SpmdTypeError:
        raise
    except Exception as e:  # noqa: BLE001 - JAX raises ValueError, TypeError, NameError, Exception
        err = translate(e, where)
        if err is None:
            note = typed_value_note(e)
            if note is not None and note not in getattr(e, "__notes__", ()):
                e.add_note(note)
            raise
        raise raised_as(err, e) from e
