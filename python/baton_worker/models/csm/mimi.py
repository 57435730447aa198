"""Mimi's decoder (transformers' MimiModel.decode), the audio codec of Sesame's CSM,
in plain PyTorch: codes [batch, codebooks, frames] at 12.5 Hz -> PCM
[batch, audio_channels, frames * frame_samples] at 24 kHz (1920 samples a frame).

  1. split RVQ dequantization: the first num_semantic_quantizers codebooks and
     the rest (acoustic) each sum their codebook vectors (embed_sum /
     cluster_usage: the checkpoint keeps the codebooks' running sums) and go through
     their own 1x1 output projection; the two results are added;
  2. upsample: a depthwise ConvTranspose1d of stride 2 (12.5 -> 25 Hz) whose
     padding is trimmed on the right, so it stays causal;
  3. the decoder transformer: pre-LayerNorm layers with RoPE and causal
     sliding-window self-attention (a query sees the `sliding_window` latest
     positions, itself included), an MLP without biases, each branch scaled by
     a learnt per-channel layer scale before its residual;
  4. the SEANet decoder: a causal Conv1d (zeros on the left), then per
     upsampling ratio r an ELU, a ConvTranspose1d (kernel 2r, stride r, right
     padding trimmed) and residual blocks (ELU, dilated conv, ELU, 1x1 conv,
     plus the input); then an ELU and the last conv.

The operations and their order follow transformers (SDPA with is_causal when
the sequence is shorter than the window, a boolean mask otherwise; the RoPE
tables computed the same way), so float32 results are the same bits.

Every layer is causal, so a frame's samples depend only on it and a bounded
number of frames before it: `left_context_frames` (1001 frames, 80 s, for
Mimi's defaults, nearly all of it the attention's reach: 8 layers x 249
positions at 25 Hz). A stream can therefore be decoded window by window
without state: decode_window(codes, num_new) decodes a window of context +
new frames and returns the new frames' samples, those the whole sequence
gives when the window holds left_context_frames of context or starts at the
stream's first frame (up to float32 rounding: convolutions and attention over
other lengths may sum in another order). Only the upsample and transformer
run over the whole window; the SEANet convs, the costly part at audio rate,
run over the new frames and the few steps of context they need.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from ..llava.vision import activation
from ..windowed_codec import aligned, keep_mask, window_attention, window_mask, window_rope

# CsmForConditionalGeneration keeps its Mimi under `codec_model`; a MimiModel
# directory (kyutai/mimi) stores the same names with no prefix.
CODEC_PREFIX = "codec_model."

# MimiConfig's defaults for what the decoder reads: a saved config may leave out
# a value equal to its default, and transformers then uses these.
_DEFAULTS = {
    "sampling_rate": 24_000,
    "audio_channels": 1,
    "hidden_size": 512,
    "num_filters": 64,
    "num_residual_layers": 1,
    "upsampling_ratios": [8, 6, 5, 4],
    "kernel_size": 7,
    "last_kernel_size": 3,
    "residual_kernel_size": 3,
    "dilation_growth_rate": 2,
    "use_causal_conv": True,
    "pad_mode": "constant",
    "compress": 2,
    "trim_right_ratio": 1.0,
    "codebook_size": 2048,
    "num_quantizers": 32,
    "use_conv_shortcut": False,
    "vector_quantization_hidden_dimension": 256,
    "num_semantic_quantizers": 1,
    "upsample_groups": 512,
    "num_hidden_layers": 8,
    "intermediate_size": 2048,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": None,
    "hidden_act": "gelu",
    "norm_eps": 1e-5,
    "sliding_window": 250,
    "attention_bias": False,
}
_ROPE_THETA = 10000.0
# MimiEuclideanCodebook's epsilon: unused codebook entries (usage 0) divide by it.
_USAGE_EPS = 1e-5


def mimi_config(config: dict) -> dict:
    """Mimi's settings, defaults filled in, from a MimiModel config.json or CSM's (its `codec_config`)."""
    raw = config.get("codec_config", config)
    return {**_DEFAULTS, **{k: v for k, v in raw.items() if v is not None or k not in _DEFAULTS}}


def _frame_rate(c: dict) -> float:
    """MimiConfig.frame_rate: an explicit (older configs) value, else the encoder's strides (ratios, then 2)."""
    explicit = c.get("frame_rate", c.get("_frame_rate"))
    if explicit is not None:
        return float(explicit)
    return c["sampling_rate"] / (math.prod(c["upsampling_ratios"]) * 2)


def _upsample_kernel(c: dict) -> int | None:
    """The 12.5 -> 25 Hz ConvTranspose1d's kernel (stride 2), or None where the encoder does not downsample."""
    encodec_rate = math.ceil(c["sampling_rate"] / math.prod(c["upsampling_ratios"]))
    frame_rate = _frame_rate(c)
    return None if frame_rate == encodec_rate else 2 * int(encodec_rate / frame_rate)


def _seanet_layout(c: dict) -> list[tuple]:
    """MimiDecoder's layers with their indices (ELUs take indices too):
    ("conv", name, kernel, dilation), ("elu",), ("up", name, stride) or ("res", [conv, conv], shortcut conv or None)."""
    layout: list[tuple] = [("conv", "0", int(c["kernel_size"]), 1)]
    i = 1
    for r in (int(r) for r in c["upsampling_ratios"]):
        layout += [("elu",), ("up", str(i + 1), r)]
        i += 2
        for j in range(int(c["num_residual_layers"])):
            dilation = int(c["dilation_growth_rate"]) ** j
            convs = [("conv", f"{i}.block.1", int(c["residual_kernel_size"]), dilation), ("conv", f"{i}.block.3", 1, 1)]
            layout.append(("res", convs, ("conv", f"{i}.shortcut", 1, 1) if c["use_conv_shortcut"] else None))
            i += 1
    return layout + [("elu",), ("conv", str(i + 1), int(c["last_kernel_size"]), 1)]


def _earliest(ops: Sequence[tuple[int, ...]], index: int) -> int:
    """The first input index that output `index` of the causal layer chain `ops` depends on.

    An op is (span,) for a stride-1 causal layer looking `span` inputs back, or
    (kernel, stride) for a transposed conv trimmed on the right.
    """
    for op in reversed(ops):
        if len(op) == 1:
            index -= op[0]
        else:
            kernel, stride = op
            # Output m sums inputs i with 0 <= m - stride*i < kernel.
            index = (index - kernel) // stride + 1
    return index


def receptive_field(config: dict) -> tuple[int, int]:
    """(left_context_frames, seanet_context_steps) of a Mimi config.

    left_context_frames: the frames before a frame that its samples depend on
    (through the upsample, the transformer's layers, each reaching
    sliding_window - 1 positions back, and the SEANet convs); 1001 for Mimi's
    defaults. seanet_context_steps: the same for the SEANet alone, in
    transformer positions (8 for the defaults).
    """
    c = mimi_config(config)
    head: list[tuple[int, ...]] = []
    steps_per_frame = 1
    kernel = _upsample_kernel(c)
    if kernel is not None:
        head.append((kernel, 2))
        steps_per_frame = 2
    head.append((int(c["num_hidden_layers"]) * (int(c["sliding_window"]) - 1),))
    seanet: list[tuple[int, ...]] = []
    for layer in _seanet_layout(c):
        if layer[0] == "conv":
            seanet.append(((layer[2] - 1) * layer[3],))
        elif layer[0] == "up":
            seanet.append((2 * layer[2], layer[2]))
        elif layer[0] == "res":
            seanet.append((sum((k - 1) * d for _, _, k, d in layer[1]),))
    # Measured back from the first sample of a frame far from the start: every
    # stride divides frame_samples, so the distance is the same for every frame.
    t = 1 << 20
    first_sample = t * steps_per_frame * math.prod(int(r) for r in c["upsampling_ratios"])
    return t - _earliest(head + seanet, first_sample), t * steps_per_frame - _earliest(seanet, first_sample)


class MimiDecoder(torch.nn.Module):
    """codes [batch, codebooks, frames] -> PCM [batch, audio_channels, frames * frame_samples].

    `get(name)` returns a checkpoint tensor (already on its device and dtype);
    `config` is config.json's dict (CSM's, or a MimiModel's with prefix="").
    """

    def __init__(self, get: Callable[[str], torch.Tensor], config: dict, prefix: str = CODEC_PREFIX):
        super().__init__()
        c = mimi_config(config)
        if not c["use_causal_conv"] or c["trim_right_ratio"] != 1.0 or c["pad_mode"] != "constant":
            # Other settings look ahead or pad differently; no Mimi checkpoint uses them.
            raise ValueError("Mimi's decoder needs use_causal_conv=true, trim_right_ratio=1.0 and pad_mode='constant'")
        get = aligned(get)
        p = prefix
        self.sampling_rate = int(c["sampling_rate"])
        self.audio_channels = int(c["audio_channels"])
        self.codebook_size = int(c["codebook_size"])
        self.num_quantizers = int(c["num_quantizers"])
        self.num_semantic = int(c["num_semantic_quantizers"])
        self.frame_rate = _frame_rate(c)
        self.left_context_frames, self.seanet_context_steps = receptive_field(c)

        # 1. RVQ tables (the checkpoint stores running sums and counts) and output projections.
        def table(q: str) -> torch.Tensor:
            usage = get(q + "codebook.cluster_usage")
            return get(q + "codebook.embed_sum") / usage.clamp(min=_USAGE_EPS)[:, None]

        has_proj = int(c["vector_quantization_hidden_dimension"]) != int(c["hidden_size"])
        self.rvq = []
        for name, count in (("semantic", self.num_semantic), ("acoustic", self.num_quantizers - self.num_semantic)):
            q = f"{p}quantizer.{name}_residual_vector_quantizer."
            tables = [table(f"{q}layers.{i}.") for i in range(count)]
            self.rvq.append((tables, get(q + "output_proj.weight") if has_proj else None))

        # 2. The upsample: its padding (kernel - stride) is trimmed on the right.
        kernel = _upsample_kernel(c)
        self.upsample = None if kernel is None else (get(p + "upsample.conv.weight"), int(c["upsample_groups"]), kernel - 2)
        self.steps_per_frame = 1 if kernel is None else 2
        self.frame_samples = self.steps_per_frame * math.prod(int(r) for r in c["upsampling_ratios"])

        # 3. The decoder transformer.
        self.hidden = int(c["hidden_size"])
        self.heads = int(c["num_attention_heads"])
        self.kv_heads = int(c["num_key_value_heads"])
        self.head_dim = int(c["head_dim"] or self.hidden // self.heads)
        self.scaling = 1 / math.sqrt(self.head_dim)
        self.window = int(c["sliding_window"])
        self.norm_eps = float(c["norm_eps"])
        self.act = activation(c["hidden_act"])
        rope = c.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"Mimi's decoder supports default RoPE only, not {rope['rope_type']!r}")
        theta = float(rope.get("rope_theta", c.get("rope_theta", _ROPE_THETA)))
        # MimiRotaryEmbedding's inverse frequencies, computed as it does (float32).
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float) / self.head_dim))
        bias = bool(c["attention_bias"])
        self.layers = []
        for i in range(int(c["num_hidden_layers"])):
            q = f"{p}decoder_transformer.layers.{i}."
            w = {n: (get(q + n + ".weight"), get(q + n + ".bias")) for n in ("input_layernorm", "post_attention_layernorm")}
            for n in "qkvo":
                w[n] = (get(f"{q}self_attn.{n}_proj.weight"), get(f"{q}self_attn.{n}_proj.bias") if bias else None)
            w["fc1"], w["fc2"] = get(q + "mlp.fc1.weight"), get(q + "mlp.fc2.weight")
            w["attn_scale"], w["mlp_scale"] = get(q + "self_attn_layer_scale.scale"), get(q + "mlp_layer_scale.scale")
            self.layers.append(w)

        # 4. The SEANet decoder.
        d = f"{p}decoder.layers."

        def conv(layer: tuple) -> tuple:
            _, name, _, dilation = layer
            return ("conv", get(f"{d}{name}.conv.weight"), get(f"{d}{name}.conv.bias"), dilation)

        self.seanet: list[tuple] = []
        for layer in _seanet_layout(c):
            if layer[0] == "conv":
                self.seanet.append(conv(layer))
            elif layer[0] == "up":
                self.seanet.append(("up", get(f"{d}{layer[1]}.conv.weight"), get(f"{d}{layer[1]}.conv.bias"), layer[2]))
            elif layer[0] == "res":
                self.seanet.append(("res", [conv(x) for x in layer[1]], None if layer[2] is None else conv(layer[2])))
            else:
                self.seanet.append(layer)
        self.dtype = self.seanet[0][1].dtype

    @property
    def num_codebooks(self) -> int:
        return self.num_quantizers

    @torch.inference_mode()
    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """The whole sequence at once, as MimiModel.decode(codes).audio_values."""
        self._check(codes)
        return self._seanet(self._transformer(self._upsample(self._dequantize(codes))))

    @torch.inference_mode()
    def decode_window(self, codes: torch.Tensor, num_new: int) -> torch.Tensor:
        """codes [batch, codebooks, context + num_new] -> the last num_new frames' PCM [batch, channels, num_new * frame_samples].

        Equal to those frames of the whole sequence's decode (up to float32
        rounding) when the window holds left_context_frames frames before
        them or starts at frame 0.
        """
        self._check(codes)
        frames = codes.shape[-1]
        if not 0 <= num_new <= frames:
            raise ValueError(f"num_new must be in 0..{frames} (the window's frames); got {num_new}")
        if num_new == 0:
            return torch.zeros(codes.shape[0], self.audio_channels, 0, dtype=self.dtype, device=codes.device)
        x = self._transformer(self._upsample(self._dequantize(codes)))
        first = max(0, (frames - num_new) * self.steps_per_frame - self.seanet_context_steps)
        pcm = self._seanet(x[..., first:])
        return pcm[..., pcm.shape[-1] - num_new * self.frame_samples :]

    @torch.inference_mode()
    def decode_windows(self, windows: Sequence[torch.Tensor], num_new: Sequence[int]) -> list[torch.Tensor]:
        """Several requests' windows (codes [codebooks, frames_i]) -> each one's new PCM [channels, num_new_i * frame_samples].

        All windows run as one batch whatever their lengths: each is padded on
        the left to the longest, and every layer treats a row's padding as
        what lies before its window when decoded alone (the upsample's and each
        convolution's input zeroed there, the attention masked to the row's own
        positions, rotary positions counted from the row's first frame). So
        every row gets what decode_window gives it alone, up to float32
        rounding (other batch shapes sum in another order).
        """
        if len(windows) != len(num_new):
            raise ValueError(f"{len(windows)} windows but {len(num_new)} num_new values")
        for i, (w, n) in enumerate(zip(windows, num_new)):
            if w.dim() != 2:
                raise ValueError(f"window {i} must be codes [codebooks, frames]; got shape {tuple(w.shape)}")
            if not 0 <= int(n) <= w.shape[-1]:
                raise ValueError(f"window {i}: num_new must be in 0..{w.shape[-1]} (the window's frames); got {n}")
        if len(windows) == 1:
            return [self.decode_window(windows[0][None], int(num_new[0]))[0]]
        if len({w.shape[0] for w in windows}) > 1:
            raise ValueError("the windows carry different numbers of codebooks")
        longest = max(w.shape[-1] for w in windows)
        device = windows[0].device
        pads = torch.tensor([longest - w.shape[-1] for w in windows], device=device)
        codes = torch.stack([F.pad(w, (longest - w.shape[-1], 0)) for w in windows])
        self._check(codes)
        spf = self.steps_per_frame
        # Each row's first real position at the transformer's rate, and its mask of real positions.
        starts = pads * spf
        x = self._dequantize(codes) * keep_mask(pads, longest)
        x = self._transformer(self._upsample(x), starts)
        # The SEANet runs over the region every row needs: its new frames and the context their samples reach.
        firsts = [int(p) * spf + max(0, (w.shape[-1] - int(n)) * spf - self.seanet_context_steps)
                  for p, w, n in zip(pads.tolist(), windows, num_new)]
        first = min(firsts)
        pcm = self._seanet(x[..., first:], torch.tensor(firsts, device=device) - first)
        return [pcm[i, :, pcm.shape[-1] - int(n) * self.frame_samples :] for i, n in enumerate(num_new)]

    def _check(self, codes: torch.Tensor) -> None:
        if codes.dim() != 3 or codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
            raise ValueError(f"Mimi decodes integer codes [batch, codebooks, frames]; got {codes.dtype} {tuple(codes.shape)}")
        if not 1 <= codes.shape[1] <= self.num_quantizers:
            raise ValueError(f"Mimi has {self.num_quantizers} codebooks; got codes for {codes.shape[1]}")
        bad = (codes < 0) | (codes >= self.codebook_size)
        if bool(bad.any()):
            b, q, t = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"code {int(codes[b, q, t])} (batch row {b}, codebook {q}, frame {t}) is outside Mimi's codebook of {self.codebook_size} entries"
            )

    def _dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, K, T] -> [B, hidden, T]; MimiSplitResidualVectorQuantizer.decode's sums in its order."""
        out = None
        for part, (tables, proj) in zip((codes[:, : self.num_semantic], codes[:, self.num_semantic :]), self.rvq):
            if part.shape[1] == 0:
                continue
            acc = torch.full((), 0.0, device=codes.device)
            for k in range(part.shape[1]):
                acc = acc + F.embedding(part[:, k], tables[k]).permute(0, 2, 1)
            if proj is not None:
                acc = F.conv1d(acc, proj)
            out = acc if out is None else out + acc
        return out

    def _upsample(self, x: torch.Tensor) -> torch.Tensor:
        if self.upsample is None:
            return x
        weight, groups, trim = self.upsample
        x = F.conv_transpose1d(x, weight, None, stride=2, groups=groups)
        return x[..., : x.shape[-1] - trim]

    def _transformer(self, x: torch.Tensor, starts: torch.Tensor | None = None) -> torch.Tensor:
        """[B, hidden, steps] -> [B, hidden, steps]. starts [B] (decode_windows): where each row's own
        positions begin; before that a row is padding, which no position of the row attends."""
        h = x.transpose(1, 2)
        steps = h.shape[1]
        cos, sin = window_rope(self.inv_freq, steps, starts, h.dtype, h.device)
        mask = window_mask(steps, self.window, starts, h.device)
        for w in self.layers:
            y = F.layer_norm(h, (self.hidden,), *w["input_layernorm"], self.norm_eps)
            h = h + w["attn_scale"] * window_attention(y, w, cos, sin, mask, self.heads, self.kv_heads, self.head_dim, self.scaling)
            y = F.layer_norm(h, (self.hidden,), *w["post_attention_layernorm"], self.norm_eps)
            h = h + w["mlp_scale"] * F.linear(self.act(F.linear(y, w["fc1"])), w["fc2"])
        return h.transpose(1, 2)

    def _seanet(self, x: torch.Tensor, starts: torch.Tensor | None = None) -> torch.Tensor:
        """starts [B] (decode_windows): each row's first own position; every convolution sees zeros before
        it, as the causal padding of a row decoded alone does."""
        keep = None if starts is None else keep_mask(starts, x.shape[-1])
        for layer in self.seanet:
            kind = layer[0]
            if kind == "elu":
                x = F.elu(x)
            elif kind == "conv":
                x = _causal_conv(x if keep is None else x * keep, layer)
            elif kind == "up":
                _, weight, bias, stride = layer
                x = F.conv_transpose1d(x if keep is None else x * keep, weight, bias, stride=stride)
                x = x[..., : x.shape[-1] - stride]
                if starts is not None:
                    starts = starts * stride
                    keep = keep_mask(starts, x.shape[-1])
            else:
                _, convs, shortcut = layer
                y = x
                for conv in convs:
                    y = F.elu(y)
                    y = _causal_conv(y if keep is None else y * keep, conv)
                x = (x if shortcut is None else _causal_conv(x if keep is None else x * keep, shortcut)) + y
        return x


def _causal_conv(x: torch.Tensor, layer: tuple) -> torch.Tensor:
    """MimiConv1d with use_causal_conv at stride 1: (kernel - 1) * dilation zeros on the left, none on the right."""
    _, weight, bias, dilation = layer
    x = F.pad(x, ((weight.shape[-1] - 1) * dilation, 0), "constant", 0.0)
    return F.conv1d(x, weight, bias, 1, 0, dilation)
