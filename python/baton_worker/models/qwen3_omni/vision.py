"""Qwen3-Omni's vision encoder (transformers' Qwen3OmniMoeVisionEncoder, the thinker's `visual`) in plain
PyTorch: every image of a step, of any sizes, in one forward, giving the image embeddings (one row per
<|image_pad|> token) and the deepstack features (one tensor per deepstack layer, the same rows).

The input is Qwen2-VL's: pixel_values [patches, C*T*P*P] and grid_thw [images, 3], each image's patches in
merge x merge blocks, the blocks row-major (Qwen3-Omni's image processor is Qwen2VLImageProcessor with
patches of 16, so qwen2_5_vl.preprocess makes them: read_image_processor_config gives its settings). The
encoder

  1. embeds each patch (a Conv3d whose stride is its kernel, with a bias) and adds a learnt position
     embedding: the square table of num_position_embeddings rows resampled to the image's patch grid
     (bilinear, align_corners: the grid's corners are the table's corners), four taps per patch;
  2. runs the blocks: LayerNorm -> attention with 2-D rotary embeddings (a patch's row rotates the first
     half of each head's frequencies, its column the second) -> LayerNorm -> a 2-layer MLP (tanh GELU), all
     with biases. Attention is within each image frame: never across images, no windows (unlike
     Qwen2.5-VL's tower, the sequence stays in input order);
  3. after each block listed in deepstack_visual_indexes, a deepstack merger: each merge x merge block's
     patches concatenated, LayerNorm over the concatenation, a 2-layer GELU MLP to the text model's hidden
     size; the features come in block order (the text model adds feature k to its hidden states at the image
     positions after its decoder layer k);
  4. the merger: LayerNorm per patch, then each block's patches concatenated and the same MLP shape.

Operations and their order follow transformers (SDPA per frame with its scale, rotary in float32, the
position table's taps and weights computed as its helper does, weighted in float32), so an image alone gives
transformers' float32 results bit for bit. Frames of equal length share one batched
scaled_dot_product_attention call, whatever the number of images.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..llava.vision import activation
from ..qwen2_5_vl.vision import _segments, segment_attention

# Where the encoder's weights live, in checkpoints and in transformers' module tree alike.
VISION_PREFIX = "thinker.visual."
# Hard-coded in transformers' blocks and mergers (the config has no eps).
LAYER_NORM_EPS = 1e-6
DEFAULT_ROPE_THETA = 10000.0

# Qwen3OmniMoeVisionEncoderConfig's defaults, for keys a saved config leaves out.
_DEFAULTS = {
    "depth": 27,
    "hidden_size": 1152,
    "hidden_act": "gelu_pytorch_tanh",
    "intermediate_size": 4304,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 3584,
    "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [8, 16, 24],
}


def vision_config(config: dict) -> dict:
    """The encoder's settings, defaults filled in, from Qwen3-Omni's config.json (thinker_config.vision_config)
    or that dict itself."""
    raw = (config.get("thinker_config") or {}).get("vision_config", config)
    if "num_heads" not in raw and "num_attention_heads" in raw:  # the config's attribute_map alias
        raw = {**raw, "num_heads": raw["num_attention_heads"]}
    return {**_DEFAULTS, **{k: v for k, v in raw.items() if v is not None or k not in _DEFAULTS}}


def read_image_processor_config(model_dir: str | Path) -> dict:
    """The image processor's raw settings, for qwen2_5_vl.preprocess (preprocess_images, image_token_count):
    transformers 5's processor_config.json (its `image_processor`) or else preprocessor_config.json (the hub's
    layout); {} (Qwen2VLImageProcessor's defaults, patches of 14) where neither exists."""
    model_dir = Path(model_dir)
    processor = model_dir / "processor_config.json"
    if processor.is_file():
        settings = json.loads(processor.read_text()).get("image_processor")
        if settings is not None:
            return settings
    legacy = model_dir / "preprocessor_config.json"
    return json.loads(legacy.read_text()) if legacy.is_file() else {}


@dataclass(frozen=True)
class _Layout:
    """Computed once per forward from grid_thw alone, in the input (merge-block) order."""

    positions: torch.Tensor  # [patches, 2] (row, col) of each patch in its frame
    taps: torch.Tensor  # [patches, 4] rows of the position table each patch interpolates
    tap_weights: torch.Tensor  # [patches, 4] float32 bilinear weights
    frames: list[torch.Tensor]  # [frames, length] indices, one per distinct frame length


class Qwen3OmniVisionEncoder:
    """pixel_values [patches, C*T*P*P] + grid_thw [images, 3] -> (image embeddings [sum of t*h*w / merge**2,
    out_hidden_size], deepstack features: one tensor of the same shape per deepstack layer), images in order:
    transformers' get_image_features' pooler_output and deepstack_features, each concatenated over images."""

    def __init__(self, get: Callable[[str], torch.Tensor], config: dict, prefix: str = VISION_PREFIX):
        """get: a stored weight by full name (already on the device and in the dtype to run in); config: the
        vision config or the whole config.json (see vision_config)."""
        c = vision_config(config)
        self.hidden = int(c["hidden_size"])
        self.heads = int(c["num_heads"])
        if self.hidden % self.heads or (self.hidden // self.heads) % 4:
            raise ValueError(f"vision hidden_size {self.hidden} must split into {self.heads} heads of a multiple of 4")
        self.head_dim = self.hidden // self.heads
        self.scale = self.head_dim**-0.5
        self.patch = int(c["patch_size"])
        self.temporal_patch = int(c["temporal_patch_size"])
        self.in_channels = int(c["in_channels"])
        self.merge = int(c["spatial_merge_size"])
        self.side = int(int(c["num_position_embeddings"]) ** 0.5)
        self.deepstack_indexes = [int(i) for i in c["deepstack_visual_indexes"]]
        self.act = activation(c["hidden_act"])
        rope = c.get("rope_parameters") or {}
        if rope.get("rope_type", "axial") != "axial":
            raise ValueError(f"the vision encoder supports only axial rope, got {rope.get('rope_type')!r}")
        theta = float(rope.get("rope_theta", DEFAULT_ROPE_THETA))
        # Axial rotary: head_dim/4 frequencies, shared by the row and the column.
        axis_dim = self.head_dim // 2
        inv_freq = 1.0 / (theta ** (torch.arange(0, axis_dim, 2, dtype=torch.float) / axis_dim))

        p = prefix
        self.patch_weight = get(p + "patch_embed.proj.weight")
        self.patch_bias = get(p + "patch_embed.proj.bias")
        self.pos_embed = get(p + "pos_embed.weight")
        if self.pos_embed.shape[0] != self.side * self.side:
            raise ValueError(f"pos_embed has {self.pos_embed.shape[0]} rows, not a square of {self.side}")
        self.blocks = []
        for i in range(int(c["depth"])):
            b = f"{p}blocks.{i}."
            self.blocks.append({
                "norm1": _linear(get, b + "norm1"),
                "norm2": _linear(get, b + "norm2"),
                "qkv": _linear(get, b + "attn.qkv"),
                "proj": _linear(get, b + "attn.proj"),
                "fc1": _linear(get, b + "mlp.linear_fc1"),
                "fc2": _linear(get, b + "mlp.linear_fc2"),
            })  # fmt: skip
        for i in self.deepstack_indexes:
            if not 0 <= i < len(self.blocks):
                raise ValueError(f"deepstack_visual_indexes names block {i} of {len(self.blocks)}")
        self.merger = _merger(get, p + "merger.")
        # transformers' merger_list[k] serves deepstack_visual_indexes[k].
        self.deepstack_mergers = [_merger(get, f"{p}merger_list.{k}.") for k in range(len(self.deepstack_indexes))]
        self.out_hidden = self.merger["fc2"][0].shape[0]
        self.inv_freq = inv_freq.to(self.patch_weight.device)

    def tokens_per_image(self, grid_thw: torch.Tensor) -> list[int]:
        """Rows of the outputs that belong to each image (t*h*w / merge**2)."""
        return [t * h * w // (self.merge * self.merge) for t, h, w in grid_thw.tolist()]

    @torch.inference_mode()
    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        weight = self.patch_weight
        if grid_thw.shape[0] == 0:
            empty = torch.zeros(0, self.out_hidden, dtype=weight.dtype, device=weight.device)
            return empty, [empty.clone() for _ in self.deepstack_indexes]
        self._check(pixel_values, grid_thw)
        layout = self._layout(grid_thw, weight.device)
        x = pixel_values.to(device=weight.device, dtype=weight.dtype)
        x = x.view(-1, self.in_channels, self.temporal_patch, self.patch, self.patch)
        x = F.conv3d(x, weight, self.patch_bias, stride=weight.shape[2:]).view(-1, self.hidden)
        # The table's taps weighted in float32 (the weights are), then back to the run's dtype.
        positions = (self.pos_embed[layout.taps] * layout.tap_weights[:, :, None]).sum(1)
        x = x + positions.to(x.dtype)
        cos, sin = self._rotary(layout.positions)
        deepstack = []
        for i, block in enumerate(self.blocks):
            x = x + self._attention(_layer_norm(x, block["norm1"]), block, cos, sin, layout.frames)
            x = x + F.linear(self.act(F.linear(_layer_norm(x, block["norm2"]), *block["fc1"])), *block["fc2"])
            if i in self.deepstack_indexes:
                merger = self.deepstack_mergers[self.deepstack_indexes.index(i)]
                deepstack.append(self._merge(_layer_norm(self._blocks_of(x), merger["norm"]), merger))
        embeddings = self._merge(self._blocks_of(_layer_norm(x, self.merger["norm"])), self.merger)
        return embeddings, deepstack

    __call__ = forward

    def _blocks_of(self, x: torch.Tensor) -> torch.Tensor:
        """[patches, hidden] -> [merged tokens, merge*merge*hidden]: each block's patches side by side."""
        return x.view(-1, self.hidden * self.merge * self.merge)

    @staticmethod
    def _merge(x: torch.Tensor, merger: dict) -> torch.Tensor:
        return F.linear(F.gelu(F.linear(x, *merger["fc1"])), *merger["fc2"])

    def _check(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> None:
        if grid_thw.dim() != 2 or grid_thw.shape[1] != 3:
            raise ValueError(f"grid_thw must be [images, 3], got {tuple(grid_thw.shape)}")
        patches = 0
        for t, h, w in grid_thw.tolist():
            if t < 1 or h < 1 or w < 1 or h % self.merge or w % self.merge:
                raise ValueError(f"grid {t}x{h}x{w} is not whole {self.merge}x{self.merge} blocks")
            patches += t * h * w
        width = self.in_channels * self.temporal_patch * self.patch * self.patch
        if tuple(pixel_values.shape) != (patches, width):
            raise ValueError(f"pixel_values must be [{patches}, {width}] for these grids, got {tuple(pixel_values.shape)}")

    def _layout(self, grid_thw: torch.Tensor, device: torch.device) -> _Layout:
        """Each patch's (row, col) and its position-table taps, as transformers' get_vision_position_ids and
        get_vision_interpolation_indices_and_weights (bilinear, align_corners) compute them."""
        grid = grid_thw.to(device="cpu", dtype=torch.int64)
        merge = self.merge
        counts = grid[:, 0] * grid[:, 1] * grid[:, 2]
        heights = torch.repeat_interleave(grid[:, 1], counts)
        widths = torch.repeat_interleave(grid[:, 2], counts)
        starts = torch.repeat_interleave(F.pad(counts.cumsum(0)[:-1], (1, 0)), counts)
        # Position inside the patch's frame, in merge-block order (every frame of an image alike).
        within = (torch.arange(int(counts.sum())) - starts) % (heights * widths)
        block_row = within // (merge * merge * (widths // merge))
        block_col = (within // (merge * merge)) % (widths // merge)
        row = block_row * merge + (within // merge) % merge
        col = block_col * merge + within % merge
        row_taps, row_weights = self._axis_taps(row, heights)
        col_taps, col_weights = self._axis_taps(col, widths)
        taps = (row_taps[:, :, None] * self.side + col_taps[:, None, :]).reshape(-1, 4)
        tap_weights = (row_weights[:, :, None] * col_weights[:, None, :]).reshape(-1, 4)
        frame_lengths = [h * w for t, h, w in grid.tolist() for _ in range(t)]
        return _Layout(
            positions=torch.stack([row, col], dim=-1).to(device),
            taps=taps.to(device),
            tap_weights=tap_weights.to(device),
            frames=[s.to(device) for s in _segments(frame_lengths)],
        )

    def _axis_taps(self, index: torch.Tensor, size: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Bilinear taps (floor, floor + 1, clamped to the table) and weights along one axis of `size` patches,
        the axis's ends on the table's ends (float32, transformers' expressions)."""
        src = index.to(torch.float32) * (self.side - 1) / torch.clamp(size - 1, min=1)
        floor = torch.floor(src)
        offsets = torch.arange(0, 2)
        taps = (floor.long()[:, None] + offsets).clamp(0, self.side - 1)
        distance = (src[:, None] - floor[:, None] - offsets).abs()
        return taps, (1 - distance).clamp(min=0)

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [patches, head_dim] in float32: [row freqs, col freqs] twice (rotate-half layout)."""
        angles = (positions[..., None].float() * self.inv_freq.float()).flatten(1)  # [patches, 2 * head_dim/4]
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()

    def _attention(self, x: torch.Tensor, block: dict, cos: torch.Tensor, sin: torch.Tensor, segments: list[torch.Tensor]) -> torch.Tensor:
        return segment_attention(x, block, cos, sin, segments, self.heads, self.head_dim, self.scale)


def _linear(get: Callable[[str], torch.Tensor], name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of a Linear or a LayerNorm."""
    return get(name + ".weight"), get(name + ".bias")


def _merger(get: Callable[[str], torch.Tensor], prefix: str) -> dict:
    return {"norm": _linear(get, prefix + "ln_q"), "fc1": _linear(get, prefix + "mlp.0"), "fc2": _linear(get, prefix + "mlp.2")}


def _layer_norm(x: torch.Tensor, norm: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), *norm, eps=LAYER_NORM_EPS)
