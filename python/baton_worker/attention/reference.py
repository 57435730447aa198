"""The reference backend: a per-row loop with torch SDPA over each row's
gathered context. Slow (two gathers and one SDPA per row per layer), simple,
and what the faster backends are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .base import AttentionBackend, AttentionMetadata
from .kv_cache import slots_for


@dataclass
class RowSpan:
    """One row of a step, as the attention kernel sees it."""

    token_start: int  # offset of the row's first new token in the flat batch
    num_tokens: int  # new tokens this step
    context_start: int  # position of the first new token (= tokens already in the cache)
    context_slots: torch.Tensor  # [context_start + num_tokens] slot ids, position order

    @property
    def context_len(self) -> int:
        return self.context_start + self.num_tokens


def _mask(row: RowSpan, window: int | None, device: torch.device) -> torch.Tensor | None:
    """[num_tokens, context_len] bool mask (True = attend), or None when nothing is masked."""
    if window is None and row.num_tokens == 1:
        return None  # a decode sees its whole context
    q_pos = torch.arange(row.context_start, row.context_len, device=device)[:, None]
    k_pos = torch.arange(row.context_len, device=device)[None, :]
    allowed = k_pos <= q_pos
    if window is not None:
        # HF's sliding-window rule: key index > query index - window.
        allowed &= k_pos > q_pos - window
    return allowed


def paged_attention(
    q: torch.Tensor,
    k_slots: torch.Tensor,
    v_slots: torch.Tensor,
    rows: list[RowSpan],
    scale: float,
    window: int | None,
) -> torch.Tensor:
    """q: [T, heads, head_dim]; k_slots/v_slots: [slots, kv_heads, head_dim] -> [T, heads, head_dim]."""
    out = torch.empty_like(q)
    gqa = q.shape[1] != k_slots.shape[1]
    for row in rows:
        if row.num_tokens == 0:
            continue
        span = slice(row.token_start, row.token_start + row.num_tokens)
        q_row = q[span].transpose(0, 1).unsqueeze(0)  # [1, heads, n, d]
        k_row = k_slots.index_select(0, row.context_slots).transpose(0, 1).unsqueeze(0)
        v_row = v_slots.index_select(0, row.context_slots).transpose(0, 1).unsqueeze(0)
        mask = _mask(row, window, q.device)
        attn = F.scaled_dot_product_attention(q_row, k_row, v_row, attn_mask=mask, scale=scale, enable_gqa=gqa)
        out[span] = attn.squeeze(0).transpose(0, 1)
    return out


class ReferenceBackend(AttentionBackend):
    name = "reference"

    def prepare(self, meta: AttentionMetadata) -> AttentionBackend:
        self.slots = meta.slot_mapping
        device = meta.slot_mapping.device
        self.rows = []
        for r, (start, end, seq_len) in enumerate(zip(meta.query_start[:-1].tolist(), meta.query_start[1:].tolist(), meta.seq_lens.tolist())):
            context = slots_for(meta.block_table[r], torch.arange(seq_len, device=device), meta.block_size)
            self.rows.append(RowSpan(start, end - start, seq_len - (end - start), context))
        return self

    def run(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.cache.write(layer, self.slots, k, v)
        k_slots, v_slots = self.cache.flat(layer)
        return paged_attention(q, k_slots, v_slots, self.rows, self.scale, self.windows[layer])
