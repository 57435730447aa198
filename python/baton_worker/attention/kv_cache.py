"""The paged KV cache: one tensor per layer, addressed by engine-given block ids.

Layout per layer: [2, num_kv_heads, num_blocks * block_size, head_dim] (k, v),
a "slot" being block * block_size + offset. KV for position p of a request
lives in block_table[p // block_size] at offset p % block_size; the engine
owns allocation, the worker only reads and writes.

Heads outside the slot axis so that gathering a row's blocks gives each head's
context contiguous ([heads, rows, context, head_dim]: what SDPA wants with no
permute), a head's K is one [slots, head_dim] matrix for paged kernels, and
the new tokens' K and V of a layer are written by one index_copy_.
"""

from __future__ import annotations

import math
import mmap

import torch

from ..model.config import ModelConfig


def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty(0, dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * element


class KVCache:
    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        shape = (2, config.num_kv_heads, num_blocks * block_size, config.head_dim)
        self.layers = [_zeros(shape, dtype, device) for _ in range(config.num_layers)]

    def flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k and v of a layer viewed as [slots, kv_heads, head_dim] (strided views)."""
        kv = self.layers[layer]
        return kv[0].transpose(0, 1), kv[1].transpose(0, 1)

    def blocks(self, layer: int) -> torch.Tensor:
        """The layer as [2 * kv_heads, num_blocks, block_size * head_dim]: one row per block and head."""
        return self.layers[layer].view(2 * self.num_kv_heads, self.num_blocks, self.block_size * self.head_dim)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [T, kv_heads, head_dim] for the slots [T]; one copy kernel for both."""
        self.layers[layer].index_copy_(2, slots, torch.stack((k, v)).transpose(1, 2))


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed cache tensor. Batched backends read whole blocks and mask the
    slots not written yet, and a mask cannot hide NaN garbage (NaN * 0 is NaN),
    so the cache must start finite. On CPU an anonymous mapping is zero-filled
    by the kernel page by page on first touch, so the 1 GiB default does not
    become resident (torch.zeros would write every page)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    numel = math.prod(shape)
    buffer = mmap.mmap(-1, max(numel * torch.empty(0, dtype=dtype).element_size(), 1))
    return torch.frombuffer(buffer, dtype=dtype, count=numel).view(shape)


def slots_for(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat slot index of each position through a request's block table."""
    return block_table[positions // block_size] * block_size + positions % block_size
