"""LLaVA's `vision` node: the CLIP vision tower and the multi-modal projector,
one batched forward over every image of the step's passes."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ...graph.node_runner import NodeSubmodule, PassInfo
from ...model.weights import WeightReader

PIXEL_VALUES = "pixel_values"
IMAGE_EMBEDS = "image_embeds"

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in _ACTIVATIONS:
        raise ValueError(f"unsupported activation {name!r}; supported: {', '.join(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]


class LlavaVision(NodeSubmodule):
    """pixel_values [images, 3, H, W] of each pass -> image_embeds [image tokens, text hidden]."""

    def __init__(
        self,
        reader: WeightReader,
        vision_prefix: str,
        projector_prefix: str,
        vision_config: dict,
        feature_layers: int | list[int],
        select_strategy: str,
        projector_act: str,
        out_dtype: torch.dtype,
    ):
        super().__init__()
        p = vision_prefix
        self.heads = int(vision_config["num_attention_heads"])
        self.eps = float(vision_config.get("layer_norm_eps", 1e-5))
        self.patch = int(vision_config["patch_size"])
        self.act = activation(vision_config.get("hidden_act", "quick_gelu"))
        self.projector_act = activation(projector_act)
        self.feature_layers = feature_layers
        self.select_strategy = select_strategy
        self.out_dtype = out_dtype
        num_layers = int(vision_config["num_hidden_layers"])
        # Only the layers up to the deepest selected one run (hidden state i is layer i's output; 0 the embeddings).
        wanted = [feature_layers] if isinstance(feature_layers, int) else list(feature_layers)
        self.keep = [layer % (num_layers + 1) for layer in wanted]
        self.class_embedding = reader.get(p + "embeddings.class_embedding")
        self.patch_embedding = reader.get(p + "embeddings.patch_embedding.weight")
        self.position_embedding = reader.get(p + "embeddings.position_embedding.weight")
        self.pre_norm = (reader.get(p + "pre_layrnorm.weight"), reader.get(p + "pre_layrnorm.bias"))
        names = ("layer_norm1", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "layer_norm2", "mlp.fc1", "mlp.fc2")
        self.layers = [
            {n: (reader.get(f"{p}encoder.layers.{i}.{n}.weight"), reader.get(f"{p}encoder.layers.{i}.{n}.bias")) for n in names}
            for i in range(max(self.keep))
        ]
        q = projector_prefix
        bias = reader.has(q + "linear_1.bias")
        self.linear_1 = (reader.get(q + "linear_1.weight"), reader.get(q + "linear_1.bias") if bias else None)
        self.linear_2 = (reader.get(q + "linear_2.weight"), reader.get(q + "linear_2.bias") if bias else None)

    def preprocess(self, graph_walk: str, infos: list[PassInfo], prepared: list) -> tuple[torch.Tensor, list[int]]:
        images = [torch.cat(p[PIXEL_VALUES]) if p[PIXEL_VALUES] else None for p in prepared]
        counts = [0 if x is None else x.shape[0] for x in images]
        present = [x for x in images if x is not None and x.shape[0] > 0]
        batch = torch.cat(present) if present else torch.zeros(0, 3, 1, 1)
        return batch, counts

    @torch.inference_mode()
    def forward(self, graph_walk: str, infos: list[PassInfo], batch: tuple[torch.Tensor, list[int]]) -> list[dict]:
        pixels, counts = batch
        hidden = self.linear_2[0].shape[0]
        if pixels.shape[0] == 0:
            return [{IMAGE_EMBEDS: [torch.zeros(0, hidden, dtype=self.out_dtype)]} for _ in counts]
        features = self.image_features(pixels.to(self.class_embedding.dtype))  # [images, tokens, hidden]
        out, at = [], 0
        for n in counts:
            out.append({IMAGE_EMBEDS: [features[at : at + n].reshape(-1, hidden).to(self.out_dtype)]})
            at += n
        return out

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        states = self.tower(pixels)
        chosen = [states[i] for i in self.keep]
        if self.select_strategy == "default":
            chosen = [s[:, 1:] for s in chosen]
        x = torch.cat(chosen, dim=-1)
        x = F.linear(x, *self.linear_1)
        return F.linear(self.projector_act(x), *self.linear_2)

    def tower(self, pixels: torch.Tensor) -> list[torch.Tensor]:
        """Hidden states: [embeddings after pre_layrnorm, layer 1's output, ...] up to the deepest selected layer."""
        b = pixels.shape[0]
        patches = F.conv2d(pixels, self.patch_embedding, stride=self.patch).flatten(2).transpose(1, 2)
        cls = self.class_embedding.expand(b, 1, -1)
        x = torch.cat([cls, patches], dim=1) + self.position_embedding[: patches.shape[1] + 1]
        x = F.layer_norm(x, x.shape[-1:], *self.pre_norm, self.eps)
        states = [x]
        for w in self.layers:
            h = F.layer_norm(x, x.shape[-1:], *w["layer_norm1"], self.eps)
            x = x + F.linear(self._attention(h, w), *w["self_attn.out_proj"])
            h = F.layer_norm(x, x.shape[-1:], *w["layer_norm2"], self.eps)
            x = x + F.linear(self.act(F.linear(h, *w["mlp.fc1"])), *w["mlp.fc2"])
            states.append(x)
        return states

    def _attention(self, h: torch.Tensor, w: dict) -> torch.Tensor:
        b, t, d = h.shape
        q, k, v = (F.linear(h, *w[f"self_attn.{n}_proj"]).view(b, t, self.heads, -1).transpose(1, 2) for n in "qkv")
        out = F.scaled_dot_product_attention(q, k, v)
        return out.transpose(1, 2).reshape(b, t, d)
