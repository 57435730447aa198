"""Qwen2.5-VL's vision tower (transformers' Qwen2_5_VisionTransformerPretrainedModel)
in plain PyTorch: every image of a step, of any sizes, in one forward.

The sequence is all images' patches concatenated (preprocess.py's order: each
merge x merge block's patches together, blocks row-major). The tower

  1. embeds each patch (a Conv3d whose stride is its kernel: one matmul over the
     flattened C*T*P*P patch);
  2. reorders the merge blocks into windows of window_size pixels (window rows,
     then window columns, row-major inside a window; per frame, per image), the
     order every block and the merger run in;
  3. runs the blocks: RMSNorm -> attention with 2-D rotary embeddings (a patch's
     row rotates the first half of each head's frequencies, its column the
     second) -> RMSNorm -> gated SiLU MLP with biases. Blocks in
     fullatt_block_indexes attend within each image frame, the others within
     each window; attention never crosses images;
  4. merges each block of merge x merge patches into one token (RMSNorm, then a
     2-layer GELU MLP to the text model's hidden size) and puts the tokens back
     in image order.

Attention is block-diagonal. Segments (windows or frames) of equal length are
gathered into one batched scaled_dot_product_attention: windows mostly share
one length, so a step is a handful of attention calls, with no mask and no
padding to drop, whatever the number of images.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..llava.vision import activation

# Where the tower's weights live: checkpoints (and transformers 5's save_pretrained,
# which writes the original names back) use `visual.`, transformers 5's module tree `model.visual.`.
VISION_PREFIXES = ("visual.", "model.visual.")
PROBE_WEIGHT = "patch_embed.proj.weight"
# transformers hard-codes the eps of every vision RMSNorm (the config has none).
RMS_EPS = 1e-6
DEFAULT_ROPE_THETA = 10000.0


def vision_prefix(names: Iterable[str]) -> str:
    """The prefix of the tower's weights among the stored names."""
    names = set(names)
    for prefix in VISION_PREFIXES:
        if prefix + PROBE_WEIGHT in names:
            return prefix
    raise ValueError(f"no weight {PROBE_WEIGHT!r} under any of {', '.join(VISION_PREFIXES)}")


@dataclass(frozen=True)
class _Layout:
    """Where each patch goes, computed once per forward from grid_thw alone."""

    order: torch.Tensor  # [patches]: the patch at each position of the window-ordered sequence
    restore: torch.Tensor  # [merged tokens]: the inverse of the merged tokens' window order
    positions: torch.Tensor  # [patches, 2] (row, col) of each patch, window order
    windows: list[torch.Tensor]  # [segments, length] indices, one per distinct window length
    frames: list[torch.Tensor]  # the same for whole frames (full-attention blocks)


class Qwen25VisionTower:
    """pixel_values [patches, C*T*P*P] + grid_thw [images, 3] -> image embeddings
    [sum of t*h*w / merge**2, out_hidden_size], images in order (equal to what
    transformers' get_image_features hands the language model, concatenated)."""

    def __init__(self, get: Callable[[str], torch.Tensor], prefix: str, vision_config: dict):
        """get: a stored weight by full name (already on the device and in the dtype
        to run in); prefix: the tower's, e.g. `visual.` (see vision_prefix)."""
        c = vision_config
        self.hidden = int(c["hidden_size"])
        self.heads = int(c.get("num_heads", c.get("num_attention_heads", 16)))
        if self.hidden % self.heads or (self.hidden // self.heads) % 4:
            raise ValueError(f"vision hidden_size {self.hidden} must split into {self.heads} heads of a multiple of 4")
        self.head_dim = self.hidden // self.heads
        self.patch = int(c.get("patch_size", 14))
        self.temporal_patch = int(c.get("temporal_patch_size", 2))
        self.in_channels = int(c.get("in_channels", c.get("in_chans", 3)))
        self.merge = int(c.get("spatial_merge_size", 2))
        # Window side in merged tokens (window_size is in pixels).
        self.window_units = int(c.get("window_size", 112)) // self.merge // self.patch
        if self.window_units < 1:
            raise ValueError(f"vision window_size {c.get('window_size')} is smaller than one merged token")
        self.full_attention = {int(i) for i in c.get("fullatt_block_indexes", [])}
        self.act = activation(c.get("hidden_act", "silu"))
        theta = float((c.get("rope_parameters") or {}).get("rope_theta", DEFAULT_ROPE_THETA))
        # Axial rotary: head_dim/4 frequencies, shared by the row and the column.
        axis_dim = self.head_dim // 2
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, axis_dim, 2, dtype=torch.float) / axis_dim))

        p = prefix
        self.patch_embed = get(p + "patch_embed.proj.weight").reshape(self.hidden, -1)
        self.blocks = []
        for i in range(int(c["depth"])):
            b = f"{p}blocks.{i}."
            self.blocks.append({
                "norm1": get(b + "norm1.weight"),
                "norm2": get(b + "norm2.weight"),
                "qkv": _linear(get, b + "attn.qkv"),
                "proj": _linear(get, b + "attn.proj"),
                "gate": _linear(get, b + "mlp.gate_proj"),
                "up": _linear(get, b + "mlp.up_proj"),
                "down": _linear(get, b + "mlp.down_proj"),
            })
        self.merger_norm = get(p + "merger.ln_q.weight")
        self.merger_1 = _linear(get, p + "merger.mlp.0")
        self.merger_2 = _linear(get, p + "merger.mlp.2")
        self.out_hidden = self.merger_2[0].shape[0]
        self.inv_freq = self.inv_freq.to(self.patch_embed.device)

    def tokens_per_image(self, grid_thw: torch.Tensor) -> list[int]:
        """Rows of the output that belong to each image (t*h*w / merge**2)."""
        return [t * h * w // (self.merge * self.merge) for t, h, w in grid_thw.tolist()]

    @torch.inference_mode()
    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        weight = self.patch_embed
        if grid_thw.shape[0] == 0:
            return torch.zeros(0, self.out_hidden, dtype=weight.dtype, device=weight.device)
        self._check(pixel_values, grid_thw)
        layout = self._layout(grid_thw, weight.device)
        x = F.linear(pixel_values.to(device=weight.device, dtype=weight.dtype), weight)[layout.order]
        cos, sin = self._rotary(layout.positions)
        for i, block in enumerate(self.blocks):
            segments = layout.frames if i in self.full_attention else layout.windows
            x = x + self._attention(_rms_norm(x, block["norm1"]), block, cos, sin, segments)
            h = _rms_norm(x, block["norm2"])
            x = x + F.linear(self.act(F.linear(h, *block["gate"])) * F.linear(h, *block["up"]), *block["down"])
        x = _rms_norm(x, self.merger_norm).reshape(-1, self.hidden * self.merge * self.merge)
        x = F.linear(F.gelu(F.linear(x, *self.merger_1)), *self.merger_2)
        return x[layout.restore]

    __call__ = forward

    def _check(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> None:
        if grid_thw.dim() != 2 or grid_thw.shape[1] != 3:
            raise ValueError(f"grid_thw must be [images, 3], got {tuple(grid_thw.shape)}")
        patches = 0
        for t, h, w in grid_thw.tolist():
            if t < 1 or h % self.merge or w % self.merge or h < 1 or w < 1:
                raise ValueError(f"grid {t}x{h}x{w} is not whole {self.merge}x{self.merge} blocks")
            patches += t * h * w
        width = self.in_channels * self.temporal_patch * self.patch * self.patch
        if tuple(pixel_values.shape) != (patches, width):
            raise ValueError(f"pixel_values must be [{patches}, {width}] for these grids, got {tuple(pixel_values.shape)}")

    def _layout(self, grid_thw: torch.Tensor, device: torch.device) -> _Layout:
        unit, win = self.merge * self.merge, self.window_units
        in_block = torch.arange(unit)
        block_order, rows, cols = [], [], []
        window_lengths, frame_lengths = [], []
        blocks_before = 0
        for t, h, w in grid_thw.tolist():
            bh, bw = h // self.merge, w // self.merge
            block_row = torch.arange(bh).repeat_interleave(bw)
            block_col = torch.arange(bw).repeat(bh)
            # Each block's window (frame-major, then window rows, window columns); a stable
            # sort by it keeps the blocks of one window row-major, as transformers orders them.
            windows_w = -(-bw // win)
            per_frame = -(-bh // win) * windows_w
            window = (block_row // win) * windows_w + block_col // win
            window = (torch.arange(t)[:, None] * per_frame + window).flatten()
            block_order.append(torch.argsort(window, stable=True) + blocks_before)
            counts = torch.bincount(window)
            window_lengths += (counts[counts > 0] * unit).tolist()
            frame_lengths += [h * w] * t
            # Patch (row, col) in preprocess order: a block's patches row-major inside it.
            rows.append((block_row[:, None] * self.merge + in_block // self.merge).flatten().repeat(t))
            cols.append((block_col[:, None] * self.merge + in_block % self.merge).flatten().repeat(t))
            blocks_before += t * bh * bw
        blocks = torch.cat(block_order)
        order = (blocks[:, None] * unit + in_block).flatten()
        restore = torch.empty_like(blocks)
        restore[blocks] = torch.arange(blocks.numel())
        positions = torch.stack([torch.cat(rows), torch.cat(cols)], dim=-1)[order]
        return _Layout(
            order=order.to(device),
            restore=restore.to(device),
            positions=positions.to(device),
            windows=[s.to(device) for s in _segments(window_lengths)],
            frames=[s.to(device) for s in _segments(frame_lengths)],
        )

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [patches, head_dim] in float32: [row freqs, col freqs] twice (rotate-half layout)."""
        angles = (positions[..., None].float() * self.inv_freq).flatten(1)  # [patches, 2 * head_dim/4]
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()

    def _attention(self, x: torch.Tensor, block: dict, cos: torch.Tensor, sin: torch.Tensor, segments: list[torch.Tensor]) -> torch.Tensor:
        return segment_attention(x, block, cos, sin, segments, self.heads, self.head_dim)


def _linear(get: Callable[[str], torch.Tensor], name: str) -> tuple[torch.Tensor, torch.Tensor]:
    return get(name + ".weight"), get(name + ".bias")


def segment_attention(x: torch.Tensor, block: dict, cos: torch.Tensor, sin: torch.Tensor, segments: list[torch.Tensor],
                      heads: int, head_dim: int, scale: float | None = None) -> torch.Tensor:
    """A vision block's self-attention within segments (windows, frames or images): block["qkv"] and
    block["proj"] are (weight, bias); each segment index [segments, length] gathers its patches into one
    batched attention call, so no patch attends outside its segment. scale None: SDPA's own."""
    n = x.shape[0]
    q, k, v = F.linear(x, *block["qkv"]).view(n, 3, heads, head_dim).unbind(1)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    out = torch.empty_like(q)
    for index in segments:  # [segments, length]: gather -> [segments, heads, length, head_dim]
        o = F.scaled_dot_product_attention(*(t[index].transpose(1, 2) for t in (q, k, v)), scale=scale)
        out[index] = o.transpose(1, 2)
    return F.linear(out.reshape(n, heads * head_dim), *block["proj"])


def _segments(lengths: list[int]) -> list[torch.Tensor]:
    """Consecutive segments of these lengths as index tensors [count, length], one per distinct length."""
    starts: dict[int, list[int]] = {}
    at = 0
    for length in lengths:
        starts.setdefault(length, []).append(at)
        at += length
    return [torch.tensor(s)[:, None] + torch.arange(length) for length, s in starts.items()]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + RMS_EPS)
    return weight * h.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x [patches, heads, head_dim], in float32 as transformers does it."""
    h = x.float()
    half = h.shape[-1] // 2
    rotated = torch.cat([-h[..., half:], h[..., :half]], dim=-1)
    return (h * cos[:, None] + rotated * sin[:, None]).to(x.dtype)
