"""The checking engine over the jaxpr JAX stages: the four states (`walk`), the Shard/Partial/Rep
refinement (`refine_walk`, `refine_facts`), and the gradients the body computes, read from the
jaxpr (`gradients`)."""
