"""Sampling the step's rows: the batched sampler (vLLM's semantics), grammar
token masks, and the CPU head screen that decides plain rows from a
low-precision vocabulary projection."""
