"""What the worker remembers about a request between steps.

The engine sends a request's tokens and sampling parameters once (when added);
afterwards every sampled token is appended here, so later steps only carry
positions, counts and new block ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .protocol import SamplingParams

if TYPE_CHECKING:
    from .sampler import PenaltyBooks


@dataclass
class RequestState:
    req_id: int
    token_ids: list[int]
    num_prompt_tokens: int
    sampling: SamplingParams
    block_table: list[int] = field(default_factory=list)
    # Seeded once when sampling.seed is set, so the request's random stream
    # does not depend on which other requests share its steps.
    generator: torch.Generator | None = None
    # The sampler's penalty bookkeeping (sampler.PenaltyBooks), made on the
    # first penalised step; dropped with this state.
    penalties: PenaltyBooks | None = None

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def block_table_tensor(self, device: torch.device) -> torch.Tensor:
        return torch.tensor(self.block_table, dtype=torch.int64, device=device)
