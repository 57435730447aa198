"""How a CPU worker spends its cores: torch's OpenMP threads only on operators
big enough to gain from them, plain threads for the head screen.

A decode step's layers are many small operators: on 2 cores they ran no faster
on 2 OpenMP threads than on 1 (19.7M Llama, 32 rows: 3.1 vs 3.5 ms; 256 rows:
18.6 vs 15.5), and under serving load each parallel region waits for a thread
that the server and its clients have taken the core from. A prefill chunk of
2048 tokens gains (21 ms on 2 threads, 30-40 on 1). So a step's layers get
every core from PARALLEL_STEP_TOKENS new tokens up, else one thread; the
float32 head (the exact path) always gets every core; and the head screen
splits its rows between plain threads, one OpenMP thread each
(head_screen.py): independent shares with a single join, instead of a
barrier per operator.
"""

from __future__ import annotations

import torch

# New tokens in a step from which its layers run on every core.
PARALLEL_STEP_TOKENS = 512


class CpuThreads:
    """torch's intra-op threads on the calling thread, switched per phase of a step
    (torch.set_num_threads costs microseconds; it only changes when asked to)."""

    def __init__(self, cores: int):
        self.cores = cores
        self._current = torch.get_num_threads()

    def _use(self, threads: int) -> None:
        if threads != self._current:
            torch.set_num_threads(threads)
            self._current = threads

    def for_layers(self, num_tokens: int) -> None:
        self._use(self.cores if num_tokens >= PARALLEL_STEP_TOKENS else 1)

    def screen_shares(self) -> int:
        """How many plain threads the head screen may use after the layers: one per
        core when the layers ran on one thread; else none besides the caller, whose
        OpenMP threads are awake (and spinning) already."""
        return self.cores if self._current == 1 else 1

    def for_head(self) -> None:
        self._use(self.cores)
