"""The checking engine over the jaxpr JAX stages: the four states (`walk`), the Shard/Partial/Rep
refinement (`refine_walk`, `refine_facts`), and the tracing-time routes still used for
gradients (`refine_route`, `patching`)."""
