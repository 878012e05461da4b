"""The spmdtyped mypy plugin's feature modules (the entry point is `spmdtyped.mypy_plugin`).

One module per job; each feature module has one `analyze(ctx, ...)` that `mypy_plugin` maps
full names to. None imports JAX: the rules come from `spmdtyped._rules`.

- `names`: the full names of the feature modules below that the entry point imports on first use
  (control flow, autodiff, shard_map, custom ops, `st.numpy` / `st.nn`, wrappers).
- `config`: the `[spmdtyped]` / `[tool.spmdtyped]` settings (the JAX rule set, `unknown`) and the
  cache digest.
- `codes`: one mypy `ErrorCode` per registry entry; reporting an `SpmdTypeError`; hook guards.
- `convert`: mypy types <-> `_rules.SpmdType` operands; literal axis and argument reading.
- `constants`: array constants (`jnp.ones(4)`, a `jnp.tril` mask, numpy values, names bound
  only to them) read as Invariant operands.
- `hints`: `Varying["dp"]` & co. (type-analyze hook), bare strings, axis vocabulary, aliases.
- `meshes`: the axis names of the module's `jax.make_mesh` / `Mesh` calls (SPMD501 for
  another axis in a hint or a collective).
- `collectives`: `st.psum` & co.
- `operators`: operators, array methods and properties, `x[idx]`, `x.at[idx].op(v)`, `abs`.
- `functions`: `st.numpy` / `st.nn` functions and constructors.
- `jax_forms`: JAX's own spellings of those rows and of the collectives on typed values
  (`jnp.exp(x)`, `jnp.add(x, y)`, `jax.nn.relu(x)`, `jax.lax.psum(x, "tp")`): the same
  analysis, JAX's parameters widened to take `SArray`; plain calls keep `jax.Array`.
- `boundary`: `st.shard_map` out_specs against the declared outputs, in_specs against the
  parameter hints (function and decorator form).
- `signature`: what callers of a function under `st.shard_map` see: its parameters, with typed
  states as `jax.typing.ArrayLike` and typed outputs as `jax.Array`.
- `arguments`: rules that depend on keywords and secondary arrays (`pad`, `astype`, `sum`,
  `roll`'s shift, `softmax`'s where, ...), read from literal arguments.
- `custom`: `st.custom_op` / `st.opaque` declarations (decorator and call forms).
- `wrappers`: calls through `jax.jit(f)` and `functools.partial(f, ...)` analysed as `f`'s.
- `autodiff`: `st.grad`, `st.value_and_grad`, `st.vjp` (and `jax.grad` / `jax.value_and_grad`
  of a typed loss).
- `control`: `st.fori_loop`, `while_loop`, `scan`, `cond`, `switch`.
- `calls`: calls of the module's own functions and methods with parameters of no state (no
  annotations, `Any`): the body checked again on the call's argument types (result and errors).
- `unknown`: the opt-in `spmd-unknown` (`[spmdtyped] unknown = true`, `check --strict`): the
  first place where a typed value's state or refinement is lost, with the reason (a watch over
  the call and method hooks, `jax.tree.map` of an unknown tree).
- `pytrees`: pytree classes (equinox / flax nnx modules, dataclasses, NamedTuples): their
  constructors take global arrays for state-hinted fields, their leaves, their gradients;
  `jax.tree.map` lambdas typed from the trees' leaves (a helper of the module mapped: `calls`); a
  flax `nnx.Param`'s `[...]` its value's type.
"""
