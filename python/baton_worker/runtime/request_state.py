"""What the worker remembers about a request between steps.

The engine sends a request's tokens and sampling parameters once (when added);
afterwards every sampled token is appended here, so later steps only carry
positions, counts and new block ids. The forward pass reads tokens and block
tables from the persistent batch's columns (persistent_batch.py, row `slot`);
token_ids is kept for the sampler (penalties, min_tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..protocol import SamplingParams

if TYPE_CHECKING:
    from ..sampling.sampler import PenaltyBooks


@dataclass
class RequestState:
    req_id: int
    token_ids: list[int]
    num_prompt_tokens: int
    sampling: SamplingParams
    # Row of the request in the persistent batch (-1: not in one).
    slot: int = -1
    # Top alternatives per prompt position (AddedRequest.prompt_logprobs); -1: no prompt logprobs.
    prompt_logprobs: int = -1
    # The LoRA adapter every row of the request runs with (AddedRequest.lora_id; 0: the base model).
    lora_id: int = 0
    # The sampler's penalty bookkeeping (sampler.PenaltyBooks), made on the
    # first penalised step; dropped with this state.
    penalties: PenaltyBooks | None = None

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens
