"""The spmdtyped mypy plugin's feature modules (the entry point is `spmdtyped.mypy_plugin`).

One module per job; each feature module has one `analyze(ctx, ...)` that `mypy_plugin` maps
full names to. None imports JAX: the rules come from `spmdtyped._rules`.

- `config`: the `[spmdtyped]` / `[tool.spmdtyped]` settings (the JAX rule set) and the cache digest.
- `codes`: one mypy `ErrorCode` per registry entry; reporting an `SpmdTypeError`; hook guards.
- `convert`: mypy types <-> `_rules.SpmdType` operands; literal axis and argument reading.
- `hints`: `Varying["dp"]` & co. (type-analyze hook), bare strings, axis vocabulary, aliases.
- `collectives`: `st.psum` & co.
- `operators`: operators, array methods and properties, `x[idx]`, `x.at[idx].op(v)`, `abs`.
- `functions`: `st.numpy` / `st.nn` functions and constructors.
- `boundary`: `st.shard_map` out_specs against the declared outputs (function and decorator form).
- `autodiff`: `st.grad`, `st.value_and_grad`, `st.vjp`.
- `control`: `st.fori_loop`, `while_loop`, `scan`, `cond`, `switch`.
"""
