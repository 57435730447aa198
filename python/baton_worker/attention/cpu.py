"""The CPU backend: one SDPA call per bucket of rows per layer.

All decodes of similar context length form one bucket, prefill chunks are
bucketed by query and context length (see base.buckets). For a bucket, one
index_select gathers every row's context blocks for all heads into
[2, kv_heads, rows, context, head_dim] (a reused workspace: a fresh tensor of
that size costs more in page faults than the copy itself), and one SDPA call
with an additive mask (causal, sliding window, padding) attends.

GQA without enable_gqa: the query heads that share a KV head are folded into
the query-length axis ([kv_heads, rows, group * q_max, head_dim]), so K/V are
never expanded and SDPA's fused CPU kernel applies.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from .base import AttentionBackend, AttentionMetadata, Bucket, allowed, buckets


@dataclass
class _Prepared:
    bucket: Bucket
    token_index: torch.Tensor
    pages: torch.Tensor  # [P * pages] block ids, row-major
    masks: dict  # window -> additive mask broadcastable to [kv_heads, P, group * q_max, context]
    dest: torch.Tensor | None
    real: torch.Tensor | None


class CpuBackend(AttentionBackend):
    name = "cpu"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.group = self.num_heads // self.num_kv_heads
        self.workspace = torch.empty(0, dtype=self.cache.layers[0].dtype, device=self.cache.layers[0].device)

    def prepare(self, meta: AttentionMetadata) -> AttentionBackend:
        self.slots = meta.slot_mapping
        self.num_tokens = int(meta.query_start[-1])
        dtype = self.workspace.dtype
        self.prepared = []
        for b in buckets(meta):
            pages = meta.block_table[torch.from_numpy(b.rows)][:, : b.pages].reshape(-1)
            context = b.pages * meta.block_size
            masks = {}
            for window in set(self.windows):
                ok = torch.from_numpy(allowed(b.q_pos, context, window))  # [P, q_max, context]
                mask = torch.zeros(ok.shape, dtype=dtype).masked_fill_(~ok, float("-inf"))
                if b.q_max > 1:  # repeat per folded query head: [P, group * q_max, context]
                    mask = mask[:, None].expand(-1, self.group, -1, -1).reshape(len(b.rows), self.group * b.q_max, context)
                masks[window] = mask[None]
            as_tensor = lambda a: None if a is None else torch.from_numpy(a)  # noqa: E731
            self.prepared.append(_Prepared(b, torch.from_numpy(b.token_index), pages, masks, as_tensor(b.dest), as_tensor(b.real)))
        # One bucket holding every token in order: its output is the step's output.
        only = self.prepared[0] if len(self.prepared) == 1 else None
        self.direct = only is not None and only.real is None  # then token_index is arange(T)
        return self

    def _context(self, layer: int, pages: torch.Tensor, rows: int, context: int) -> torch.Tensor:
        blocks = self.cache.blocks(layer)  # [2 * kv_heads, num_blocks, block_size * head_dim]
        numel = blocks.shape[0] * pages.numel() * blocks.shape[2]
        if self.workspace.numel() < numel:
            self.workspace = torch.empty(numel, dtype=blocks.dtype)
        out = self.workspace[:numel].view(blocks.shape[0], pages.numel(), blocks.shape[2])
        torch.index_select(blocks, 1, pages, out=out)
        return out.view(2, self.num_kv_heads, rows, context, self.head_dim)

    def run(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.cache.write(layer, self.slots, k, v)
        window = self.windows[layer]
        kvh, group, d = self.num_kv_heads, self.group, self.head_dim
        out = None if self.direct else torch.empty_like(q)
        for p in self.prepared:
            b = p.bucket
            rows = len(b.rows)
            kv = self._context(layer, p.pages, rows, b.pages * self.cache.block_size)
            qb = q if self.direct else q.index_select(0, p.token_index)
            # [P * q_max, heads, d] -> [kv_heads, P, group * q_max, d]
            qb = qb.view(rows, b.q_max, kvh, group, d).permute(2, 0, 3, 1, 4).reshape(kvh, rows, group * b.q_max, d)
            o = F.scaled_dot_product_attention(qb, kv[0], kv[1], attn_mask=p.masks[window], scale=self.scale)
            o = o.view(kvh, rows, group, b.q_max, d).permute(1, 3, 0, 2, 4).reshape(rows * b.q_max, kvh * group, d)
            if self.direct:
                return o
            if p.real is None:
                out.index_copy_(0, p.token_index, o)
            else:
                out.index_copy_(0, p.dest, o.index_select(0, p.real))
        return out
