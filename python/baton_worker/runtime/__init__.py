"""The worker process and its step loop: options, start-up (loading.py),
the message loop (server.py), the persistent batch and the StepRunner that
executes engine Steps, CUDA graphs for decode steps, and CPU thread counts."""
