"""The paged KV cache: one tensor per layer, addressed by engine-given block ids.

Layout per layer: [2, num_blocks, block_size, num_kv_heads, head_dim] (k, v).
KV for position p of a request lives in block_table[p // block_size] at offset
p % block_size; the engine owns allocation, the worker only reads and writes.
"""

from __future__ import annotations

import torch

from .config import ModelConfig


def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty(0, dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * element


class KVCache:
    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device):
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (2, num_blocks, block_size, config.num_kv_heads, config.head_dim)
        # empty, not zeros: on CPU untouched pages of a large allocation are
        # never backed by memory (zeros would make the whole 1 GiB default
        # resident). Attention only gathers slots of positions already written.
        self.layers = [torch.empty(shape, dtype=dtype, device=device) for _ in range(config.num_layers)]

    def flat(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k and v of a layer viewed as [num_blocks * block_size, kv_heads, head_dim] slot arrays."""
        kv = self.layers[layer]
        return kv[0].flatten(0, 1), kv[1].flatten(0, 1)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        k_slots, v_slots = self.flat(layer)
        k_slots.index_copy_(0, slots, k)
        v_slots.index_copy_(0, slots, v)


def slots_for(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat slot index of each position through a request's block table."""
    return block_table[positions // block_size] * block_size + positions % block_size
