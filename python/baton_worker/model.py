"""One decoder covering Llama (2, 3), Mistral, Qwen2 and Qwen3.

The families differ only in small switches read from config.json: q/k/v bias
(Qwen2), per-head q/k RMSNorm (Qwen3), sliding windows (Mistral), rope scaling
(Llama 3) and tied embeddings. Weights are plain tensors keyed by their HF
names; the forward pass works on a flattened batch of new tokens and writes
their K/V into the paged cache before attending through block tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .attention import RowSpan, paged_attention
from .config import ModelConfig
from .kv_cache import KVCache
from .loader import WeightReader
from .rope import Rotary


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    q_proj: torch.Tensor
    k_proj: torch.Tensor
    v_proj: torch.Tensor
    o_proj: torch.Tensor
    q_bias: torch.Tensor | None
    k_bias: torch.Tensor | None
    v_bias: torch.Tensor | None
    o_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_norm: torch.Tensor
    gate_proj: torch.Tensor
    up_proj: torch.Tensor
    down_proj: torch.Tensor
    gate_bias: torch.Tensor | None
    up_bias: torch.Tensor | None
    down_bias: torch.Tensor | None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same arithmetic as HF's RMSNorm: normalise in float32, cast back, then scale.
    dtype = x.dtype
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def _load_layer(reader: WeightReader, config: ModelConfig, i: int) -> LayerWeights:
    p = f"model.layers.{i}."

    def opt(name: str, wanted: bool) -> torch.Tensor | None:
        return reader.get(p + name) if wanted else None

    return LayerWeights(
        input_norm=reader.get(p + "input_layernorm.weight"),
        q_proj=reader.get(p + "self_attn.q_proj.weight"),
        k_proj=reader.get(p + "self_attn.k_proj.weight"),
        v_proj=reader.get(p + "self_attn.v_proj.weight"),
        o_proj=reader.get(p + "self_attn.o_proj.weight"),
        q_bias=opt("self_attn.q_proj.bias", config.qkv_bias),
        k_bias=opt("self_attn.k_proj.bias", config.qkv_bias),
        v_bias=opt("self_attn.v_proj.bias", config.qkv_bias),
        o_bias=opt("self_attn.o_proj.bias", config.o_bias),
        q_norm=opt("self_attn.q_norm.weight", config.qk_norm),
        k_norm=opt("self_attn.k_norm.weight", config.qk_norm),
        post_norm=reader.get(p + "post_attention_layernorm.weight"),
        gate_proj=reader.get(p + "mlp.gate_proj.weight"),
        up_proj=reader.get(p + "mlp.up_proj.weight"),
        down_proj=reader.get(p + "mlp.down_proj.weight"),
        gate_bias=opt("mlp.gate_proj.bias", config.mlp_bias),
        up_bias=opt("mlp.up_proj.bias", config.mlp_bias),
        down_bias=opt("mlp.down_proj.bias", config.mlp_bias),
    )


class DecoderModel:
    def __init__(self, config: ModelConfig, reader: WeightReader):
        self.config = config
        self.dtype = reader.dtype
        self.device = reader.device
        self.embed = reader.get("model.embed_tokens.weight")
        self.layers = [_load_layer(reader, config, i) for i in range(config.num_layers)]
        self.norm = reader.get("model.norm.weight")
        # Tied models usually omit lm_head.weight; share the embedding then.
        if config.tie_word_embeddings or not reader.has("lm_head.weight"):
            self.lm_head = self.embed
        else:
            self.lm_head = reader.get("lm_head.weight")
        self.rotary = Rotary(config.rope, config.head_dim, self.device)
        self.scale = config.head_dim**-0.5

    def weight_bytes(self) -> int:
        tensors = [self.embed, self.norm] + ([] if self.lm_head is self.embed else [self.lm_head])
        for layer in self.layers:
            tensors += [t for t in vars(layer).values() if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        rows: list[RowSpan],
        logits_indices: torch.Tensor,
        cache: KVCache,
    ) -> torch.Tensor:
        """Runs all new tokens of a step; returns float32 logits [len(logits_indices), vocab]."""
        x = F.embedding(input_ids, self.embed)
        cos, sin = self.rotary.cos_sin(positions, self.dtype)
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.input_norm, self.config.rms_norm_eps)
            x = x + self._attention(i, layer, h, cos, sin, slots, rows, cache)
            h = rms_norm(x, layer.post_norm, self.config.rms_norm_eps)
            x = x + self._mlp(layer, h)
        x = x.index_select(0, logits_indices)
        x = rms_norm(x, self.norm, self.config.rms_norm_eps)
        return F.linear(x, self.lm_head).to(torch.float32)

    def _attention(self, i, layer: LayerWeights, h, cos, sin, slots, rows, cache: KVCache) -> torch.Tensor:
        c = self.config
        t = h.shape[0]
        q = F.linear(h, layer.q_proj, layer.q_bias).view(t, c.num_heads, c.head_dim)
        k = F.linear(h, layer.k_proj, layer.k_bias).view(t, c.num_kv_heads, c.head_dim)
        v = F.linear(h, layer.v_proj, layer.v_bias).view(t, c.num_kv_heads, c.head_dim)
        if layer.q_norm is not None:
            q = rms_norm(q, layer.q_norm, c.rms_norm_eps)
            k = rms_norm(k, layer.k_norm, c.rms_norm_eps)
        q = self.rotary.apply(q, cos, sin)
        k = self.rotary.apply(k, cos, sin)
        cache.write(i, slots, k, v)
        k_slots, v_slots = cache.flat(i)
        out = paged_attention(q, k_slots, v_slots, rows, self.scale, c.sliding_windows[i])
        return F.linear(out.reshape(t, c.num_heads * c.head_dim), layer.o_proj, layer.o_bias)

    def _mlp(self, layer: LayerWeights, h: torch.Tensor) -> torch.Tensor:
        gate = F.linear(h, layer.gate_proj, layer.gate_bias)
        up = F.linear(h, layer.up_proj, layer.up_bias)
        return F.linear(F.silu(gate) * up, layer.down_proj, layer.down_bias)
