"""Typed operations beyond operators: collectives and casts (`collectives`), control flow
(`control`), autodiff (`autodiff`), custom ops (`custom`), optimiser helpers (`optim`)."""
