"""The typed value: hint classes (`hints`, no JAX), the value and its operators (`array`),
its Python protocols (`protocols`), its Shard/Partial/Rep refinement (`refining`) and the
jaxtyping interop (`jaxtyping`)."""
