"""How a CPU worker spends its cores on a step: torch's OpenMP threads, or plain
threads for the head screen.

A decode step's layers are many small operators: on 2 cores they ran no faster
on 2 OpenMP threads than on 1 (19.7M Llama, 32 rows: 3.1 vs 3.5 ms; 256 rows:
18.6 vs 15.5), and under serving load each parallel region waits for a thread
that the server and its clients have taken the core from. The head screen's
work, by contrast, splits into independent shares of rows with one join. So a
step of fewer than PARALLEL_STEP_TOKENS new tokens whose screened rows are
many enough to share (head_screen.SPLIT_ROWS) runs its layers on one thread
and screens one share per core, each on a plain thread with one OpenMP
thread. An encoder-decoder's small step (Whisper's decoder: its cross
attention only reads memory) runs its layers on one thread and its float32
head on every core (the demo Whisper, 8 rows under load: 1.3x the requests/s
of every core throughout at c=1). Every other step runs on every core as one team: prefill chunks gain
from it (2048 tokens: 21 ms on 2 threads, 30-40 on 1), and so does a screen
of a few rows, whose GEMM reads the whole head for them. The float32 head
(the exact path) always runs on every core.
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

    def for_step(self, num_tokens: int, screened_rows: int, split_rows: range, layers_alone: bool = False) -> int:
        """Sets the threads of a step's layers and returns how many plain threads
        the head screen may share its rows out to. One thread and a share per
        core for a small step whose screened rows are in split_rows (a step with
        fewer rows reads the whole head for a few: one thread alone would read it
        at half the speed); one thread for a small step whose layers run best
        alone (layers_alone: an encoder-decoder's); every core and no sharing otherwise."""
        if num_tokens < PARALLEL_STEP_TOKENS and (screened_rows in split_rows or layers_alone):
            self._use(1)
            return self.cores
        self._use(self.cores)
        return 1

    def for_head(self) -> None:
        """The float32 head (the exact path) on every core."""
        self._use(self.cores)
