"""The CUDA backend: torch FlexAttention reading K/V straight from the paged cache.

Rows are bucketed as on CPU (base.buckets), each bucket one flex_attention
call with queries [P, heads, q_max, head_dim] against the whole cache of the
layer ([1, kv_heads, slots, head_dim]). The block mask makes it paged: with
KV block size = page size, row b's query tiles list exactly the row's pages
(kv_indices = its block table), so the kernel reads only those. mask_mod
supplies what is inside a page: causality and sliding windows from each
key's logical position, found through `page_position` (physical page ->
its index in the tables that use it; a page shared through the prefix cache
sits at the same index in every request, since its hash covers everything
before it). mask_mod also checks that the page is the row's own, so the
result is exact even where the block sparsity is not applied (eager mode,
which materialises the mask: that is how the CPU tests check this file).

Kept as an option (attention backend "flex"), not the default: on an H100 it
padded one-query decode rows to 128-row query tiles and recompiled on mask
strides until dynamo's limit, then fell back to an unfused path that
materialises scores over the whole cache. The Triton backend is the CUDA
default. flex steps always run eagerly (no CUDA graphs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .base import AttentionBackend, AttentionMetadata, Bucket, buckets

Q_TILE = 128


def _flex():
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    return BlockMask, flex_attention


@dataclass
class _Prepared:
    bucket: Bucket
    token_index: torch.Tensor
    masks: dict  # window -> BlockMask
    dest: torch.Tensor | None
    real: torch.Tensor | None


class FlexBackend(AttentionBackend):
    name = "flex"

    def __init__(self, *args, compile: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.BlockMask, flex_attention = _flex()
        self.kernel_options = {"BLOCK_N": min(self.cache.block_size, 64)} if compile else None
        self.flex = torch.compile(flex_attention, dynamic=True) if compile else flex_attention
        self.device = self.cache.layers[0].device
        self.page_position = torch.zeros(self.cache.num_blocks + 1, dtype=torch.int64, device=self.device)

    def _page_positions(self, meta: AttentionMetadata) -> torch.Tensor:
        """Sets page_position[page] = j for every table entry table[r, j] = page
        (unused entries land on the spare last slot); returns pages per row."""
        table = meta.block_table
        num_pages = torch.from_numpy(-(-meta.seq_lens // meta.block_size)).to(self.device)
        cols = torch.arange(table.shape[1], device=self.device)
        used = cols[None, :] < num_pages[:, None]
        target = torch.where(used, table, self.cache.num_blocks)
        self.page_position.scatter_(0, target.reshape(-1), cols.expand_as(table).reshape(-1))
        return num_pages

    def prepare(self, meta: AttentionMetadata) -> AttentionBackend:
        self.slots = meta.slot_mapping
        table = meta.block_table
        num_pages = self._page_positions(meta)
        to = lambda a: None if a is None else torch.from_numpy(a).to(self.device, non_blocking=True)  # noqa: E731
        self.prepared = []
        for b in buckets(meta):
            rows = to(b.rows)
            pages = table[rows][:, : b.pages].to(torch.int32)
            count = num_pages[rows].to(torch.int32)
            q_pos = to(b.q_pos)
            masks = {w: self._block_mask(pages, count, q_pos, b, w) for w in set(self.windows)}
            self.prepared.append(_Prepared(b, to(b.token_index), masks, to(b.dest), to(b.real)))
        return self

    def _block_mask(self, pages, count, q_pos, b: Bucket, window: int | None):
        bs, position = self.cache.block_size, self.page_position
        width = pages.shape[1]

        def mask_mod(r, h, q_idx, kv_idx):
            page = kv_idx // bs
            j = position[page]
            own = (j < count[r]) & (pages[r, j.clamp(max=width - 1)] == page)
            key = j * bs + kv_idx % bs
            query = q_pos[r, q_idx]
            ok = own & (key <= query)
            if window is not None:
                ok = ok & (key > query - window)
            return ok

        q_tiles = -(-b.q_max // Q_TILE)
        rows = pages.shape[0]
        kv_num = count[:, None, None].expand(rows, 1, q_tiles).contiguous()
        kv_idx = pages[:, None, None, :].expand(rows, 1, q_tiles, width).contiguous()
        slots = self.cache.num_blocks * bs
        return self.BlockMask.from_kv_blocks(
            kv_num, kv_idx, BLOCK_SIZE=(Q_TILE, bs), mask_mod=mask_mod, seq_lengths=(b.q_max, slots), compute_q_blocks=False
        )

    def run(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.cache.write(layer, self.slots, k, v)
        kv = self.cache.layers[layer]  # [2, kv_heads, slots, d]
        out = torch.empty_like(q)
        for p in self.prepared:
            b = p.bucket
            rows = len(b.rows)
            qb = q.index_select(0, p.token_index).view(rows, b.q_max, self.num_heads, self.head_dim).transpose(1, 2)
            o = self.flex(
                qb, kv[0][None], kv[1][None], block_mask=p.masks[self.windows[layer]], scale=self.scale,
                enable_gqa=self.num_heads != self.num_kv_heads, kernel_options=self.kernel_options,
            )
            o = o.transpose(1, 2).reshape(rows * b.q_max, self.num_heads, self.head_dim)
            if p.real is None:
                out.index_copy_(0, p.token_index, o)
            else:
                out.index_copy_(0, p.dest, o.index_select(0, p.real))
        return out
