"""Qwen3-Omni's code2wav (transformers' Qwen3OmniMoeCode2Wav) in plain PyTorch:
the talker's codes [batch, num_quantizers, frames] at 12.5 Hz -> a waveform
[batch, 1, samples] at 24 kHz, clamped to [-1, 1].

  1. embeddings: one table of num_quantizers * codebook_size rows, quantizer q's
     code c at row q * codebook_size + c; the quantizers' vectors are averaged;
  2. the pre-transformer at the frame rate: RMSNorm layers with RoPE and causal
     sliding-window self-attention (a query sees the `sliding_window` latest
     frames, itself included), a SiLU-gated MLP, each branch scaled by a learnt
     per-channel layer scale before its residual; a last RMSNorm;
  3. upsampling (upsampling_ratios, 2 x 2): per ratio f a ConvTranspose1d of
     kernel = stride = f (no overlap, nothing trimmed), then a ConvNeXt block
     (causal depthwise conv of 7, LayerNorm, Linear 4x, GELU, Linear, gamma,
     residual);
  4. the decoder (upsample_rates, 8 x 5 x 4 x 3): a causal conv of 7, then per
     rate r a SnakeBeta, a ConvTranspose1d (kernel 2r, stride r) and residual
     units (SnakeBeta, causal conv of 7 with dilation 1, 3 or 9, SnakeBeta, 1x1
     conv, plus the input); then a SnakeBeta and a causal conv of 7 to one channel.

The operations and their order follow transformers (SDPA with is_causal when
the sequence is shorter than the attention window, a boolean mask otherwise;
the RoPE tables computed the same way), so float32 results are the same bits.

The decoder's transposed convs trim kernel - stride = r outputs on the left as
well as on the right, so the output is not frames * 1920 samples long but
frames * 1920 - 555 (for the default rates): each stage drops its first r
samples, 555 in all at 24 kHz. Every layer is still causal: sample n depends
on frames up to (n + 555) // 1920 only, so decoding T frames gives a prefix of
decoding more frames, and the samples that frame j adds are
[j * 1920 - 555, (j + 1) * 1920 - 555) (the first frame adds 1920 - 555).
A sample depends on a bounded number of frames before it, `left_context_frames`
(578 frames, 46.24 s, for the defaults: 8 layers x 71 frames of attention
reach and 10 frames for the convolutions), so a stream can be decoded window by
window without state: decode_window(codes, num_new) decodes context + new
frames and returns the samples the new frames add, those the whole sequence
gives when the window holds left_context_frames of context or starts at the
stream's first frame (up to float32 rounding). The transformer runs over the
whole window; the upsampling and decoder, the costly part, over the new frames
and the few frames of context they need.

transformers' own chunked_decode(codes, chunk_size=300, left_context_size=25)
decodes chunks with 25 frames of context and drops context * 1920 samples of
each: far less context than the samples depend on (578 frames), and each chunk
after the first also loses the 555 samples before its first frame, so its
result is neither the whole decode nor continuous at the chunk boundaries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from ..llava.vision import activation
from ..windowed_codec import aligned, keep_mask, window_attention, window_mask, window_rope

# Qwen3OmniMoeForConditionalGeneration keeps the module under `code2wav`.
CODE2WAV_PREFIX = "code2wav."
# Qwen3-Omni's speech is 24 kHz (the config does not say so; 12.5 Hz frames x 1920 samples).
SAMPLING_RATE = 24_000

# Qwen3OmniMoeCode2WavConfig's defaults for what the module reads: a saved config
# may leave out a value equal to its default, and transformers then uses these.
_DEFAULTS = {
    "codebook_size": 2048,
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": None,
    "attention_bias": False,
    "sliding_window": 72,
    "intermediate_size": 3072,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "num_hidden_layers": 8,
    "num_quantizers": 16,
    "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
    "decoder_dim": 1536,
}
_ROPE_THETA = 10000.0
# Hard-coded in transformers' blocks.
_CONV_KERNEL = 7
_CONVNEXT_EPS = 1e-6
_RESIDUAL_DILATIONS = (1, 3, 9)
_SNAKE_EPS = 0.000000001


def code2wav_config(config: dict) -> dict:
    """code2wav's settings, defaults filled in, from Qwen3-Omni's config.json (its `code2wav_config`) or that dict itself."""
    raw = config.get("code2wav_config", config)
    return {**_DEFAULTS, **{k: v for k, v in raw.items() if v is not None or k not in _DEFAULTS}}


def _trims(kernel: int, stride: int) -> tuple[int, int]:
    """Qwen3OmniMoeCausalTransConvNet's trims: kernel - stride on the left and the same on the right."""
    pad = math.ceil(kernel - stride)
    return pad, pad


# The layers after the transformer, for the length and receptive-field arithmetic:
# ("conv", span) a causal stride-1 conv looking span inputs back, or
# ("tconv", kernel, stride, left_trim, right_trim) a transposed conv.
def _conv_ops(c: dict) -> list[tuple]:
    k = _CONV_KERNEL - 1
    ops: list[tuple] = []
    for f in (int(f) for f in c["upsampling_ratios"]):
        ops += [("tconv", f, f, *_trims(f, f)), ("conv", k)]
    ops.append(("conv", k))
    for r in (int(r) for r in c["upsample_rates"]):
        ops.append(("tconv", 2 * r, r, *_trims(2 * r, r)))
        ops += [("conv", k * d) for d in _RESIDUAL_DILATIONS]
    return ops + [("conv", k)]


def _length(ops: Sequence[tuple], length: int) -> int:
    """The output length of `ops` for an input of `length` steps (0 once a stage has nothing left)."""
    for op in ops:
        if length <= 0:
            return 0
        if op[0] == "tconv":
            _, kernel, stride, left, right = op
            length = (length - 1) * stride + kernel - left - right
    return max(length, 0)


def _earliest(ops: Sequence[tuple], index: int) -> int:
    """The first input index that output `index` of `ops` depends on."""
    for op in reversed(ops):
        if op[0] == "conv":
            index -= op[1]
        else:
            _, kernel, stride, left, _ = op
            # Output m is raw output m + left, which sums inputs i with 0 <= m + left - stride*i < kernel.
            index = (index + left - kernel) // stride + 1
    return index


def _latest(ops: Sequence[tuple], index: int) -> int:
    """The last input index that output `index` of `ops` depends on."""
    for op in reversed(ops):
        if op[0] == "tconv":
            _, _, stride, left, _ = op
            index = (index + left) // stride
    return index


def receptive_field(config: dict) -> tuple[int, int]:
    """(left_context_frames, conv_context_frames) of a code2wav config (Qwen3-Omni's config.json or its code2wav_config).

    left_context_frames: the frames before a frame that the samples it adds
    depend on (the transformer's layers, each reaching sliding_window - 1
    frames back, and the convolutions); 578 for the defaults.
    conv_context_frames: the same for the upsampling and decoder alone (10).
    """
    c = code2wav_config(config)
    ops = _conv_ops(c)
    # Measured from the first sample a frame far from the start adds: every stride
    # divides the frame's samples, so the distance is the same for every frame.
    t = 1 << 20
    conv = t - _earliest(ops, _length(ops, t))
    return conv + int(c["num_hidden_layers"]) * (int(c["sliding_window"]) - 1), conv


class Code2Wav(torch.nn.Module):
    """codes [batch, num_quantizers, frames] -> waveform [batch, 1, output_length(frames)] in [-1, 1].

    `get(name)` returns a checkpoint tensor (already on its device and dtype);
    `config` is config.json's dict (Qwen3-Omni's, or its code2wav_config).
    """

    def __init__(self, get: Callable[[str], torch.Tensor], config: dict, prefix: str = CODE2WAV_PREFIX):
        super().__init__()
        c = code2wav_config(config)
        get = aligned(get)
        p = prefix
        self.sampling_rate = SAMPLING_RATE
        self.codebook_size = int(c["codebook_size"])
        self.num_quantizers = int(c["num_quantizers"])
        self._ops = _conv_ops(c)
        self.left_context_frames, self.conv_context_frames = receptive_field(c)
        t = 1 << 20
        # Samples a frame adds (1920 for the defaults), and how many fewer the whole decode has (555).
        self.frame_samples = _length(self._ops, t + 1) - _length(self._ops, t)
        self.dropped_samples = t * self.frame_samples - _length(self._ops, t)
        self.frame_rate = self.sampling_rate / self.frame_samples
        if _latest(self._ops, _length(self._ops, t + 1) - 1) != t:
            raise ValueError("this code2wav layout is not causal: a frame's samples would depend on later frames")

        # 1. The embeddings.
        self.embedding = get(p + "code_embedding.weight")
        self.dtype = self.embedding.dtype
        self.code_offset = torch.arange(self.num_quantizers, device=self.embedding.device).view(1, -1, 1) * self.codebook_size

        # 2. The pre-transformer.
        self.hidden = int(c["hidden_size"])
        self.heads = int(c["num_attention_heads"])
        self.kv_heads = int(c["num_key_value_heads"])
        self.head_dim = int(c["head_dim"] or self.hidden // self.heads)
        self.scaling = self.head_dim**-0.5
        self.window = int(c["sliding_window"])
        self.norm_eps = float(c["rms_norm_eps"])
        self.act = activation(c["hidden_act"])
        rope = c.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"code2wav supports default RoPE only, not {rope['rope_type']!r}")
        theta = float(rope.get("rope_theta", c.get("rope_theta", _ROPE_THETA)))
        # Qwen3OmniMoeRotaryEmbedding's inverse frequencies, computed as it does (float32).
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float) / self.head_dim))
        bias = bool(c["attention_bias"])
        q = f"{p}pre_transformer."
        self.layers = []
        for i in range(int(c["num_hidden_layers"])):
            lq = f"{q}layers.{i}."
            w = {n: get(f"{lq}{n}.weight") for n in ("input_layernorm", "post_attention_layernorm")}
            for n in "qkvo":
                w[n] = (get(f"{lq}self_attn.{n}_proj.weight"), get(f"{lq}self_attn.{n}_proj.bias") if bias else None)
            for n in ("gate", "up", "down"):
                w[n] = get(f"{lq}mlp.{n}_proj.weight")
            w["attn_scale"], w["mlp_scale"] = get(lq + "self_attn_layer_scale.scale"), get(lq + "mlp_layer_scale.scale")
            self.layers.append(w)
        self.norm = get(q + "norm.weight")

        # 3. Upsampling: (transposed conv, ConvNeXt block) per ratio.
        def conv(name: str, dilation: int = 1) -> tuple:
            return get(name + ".conv.weight"), get(name + ".conv.bias"), dilation

        def tconv(name: str, kernel: int, stride: int) -> tuple:
            return get(name + ".conv.weight"), get(name + ".conv.bias"), stride, *_trims(kernel, stride)

        def snake(name: str) -> tuple:
            # Qwen3OmniMoeSnakeBeta's exp(alpha) and 1 / (exp(beta) + eps), computed as it does each call.
            alpha, beta = get(name + ".alpha"), get(name + ".beta")
            return torch.exp(alpha)[None, :, None], (1.0 / (torch.exp(beta) + _SNAKE_EPS))[None, :, None]

        self.upsample = []
        for i, f in enumerate(int(f) for f in c["upsampling_ratios"]):
            u = f"{p}upsample.{i}."
            block = {n: get(f"{u}1.{n}") for n in ("norm.weight", "norm.bias", "pwconv1.weight", "pwconv1.bias", "pwconv2.weight", "pwconv2.bias", "gamma")}
            block["dwconv"] = conv(f"{u}1.dwconv")
            self.upsample.append((tconv(f"{u}0", f, f), block))

        # 4. The decoder.
        d = f"{p}decoder."
        rates = [int(r) for r in c["upsample_rates"]]
        self.decoder_in = conv(f"{d}0")
        self.blocks = []
        for i, r in enumerate(rates, start=1):
            b = f"{d}{i}.block."
            units = [
                (snake(f"{b}{j}.act1"), conv(f"{b}{j}.conv1", dilation), snake(f"{b}{j}.act2"), conv(f"{b}{j}.conv2"))
                for j, dilation in enumerate(_RESIDUAL_DILATIONS, start=2)
            ]
            self.blocks.append((snake(f"{b}0"), tconv(f"{b}1", 2 * r, r), units))
        self.decoder_act = snake(f"{d}{len(rates) + 1}")
        self.decoder_out = conv(f"{d}{len(rates) + 2}")

    def output_length(self, frames: int) -> int:
        """The samples a decode of `frames` frames gives: frames * frame_samples - dropped_samples (0 for none)."""
        return _length(self._ops, frames)

    @torch.inference_mode()
    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """The whole sequence at once, as Qwen3OmniMoeCode2Wav.forward(codes)."""
        self._check(codes)
        return self._convs(self._transformer(self._embed(codes)))

    @torch.inference_mode()
    def decode_window(self, codes: torch.Tensor, num_new: int) -> torch.Tensor:
        """codes [batch, num_quantizers, context + num_new] -> the samples the last num_new frames add
        [batch, 1, output_length(frames) - output_length(context)]: num_new * frame_samples, fewer
        (by dropped_samples) for a window with no context.

        Equal to those samples of the whole sequence's decode (up to float32
        rounding) when the window holds left_context_frames frames before the
        new ones or starts at the stream's first frame.
        """
        self._check(codes)
        frames = codes.shape[-1]
        if not 0 <= num_new <= frames:
            raise ValueError(f"num_new must be in 0..{frames} (the window's frames); got {num_new}")
        new = self.output_length(frames) - self.output_length(frames - num_new)
        if new == 0:
            return torch.zeros(codes.shape[0], 1, 0, dtype=self.dtype, device=codes.device)
        x = self._transformer(self._embed(codes))
        first = max(0, frames - num_new - self.conv_context_frames)
        wav = self._convs(x[..., first:])
        return wav[..., wav.shape[-1] - new :]

    @torch.inference_mode()
    def decode_windows(self, windows: Sequence[torch.Tensor], num_new: Sequence[int]) -> list[torch.Tensor]:
        """Several requests' windows (codes [num_quantizers, frames_i]) -> the samples each one's new frames add [1, samples_i].

        All windows run as one batch whatever their lengths: each is padded on
        the left to the longest, and every layer treats a row's padding as what
        lies before its window when decoded alone (each convolution's input
        zeroed there, the attention masked to the row's own frames, rotary
        positions counted from the row's first frame; the transposed convs
        never reach a row's own samples from its padding). So every row gets
        what decode_window gives it alone, up to float32 rounding.
        """
        if len(windows) != len(num_new):
            raise ValueError(f"{len(windows)} windows but {len(num_new)} num_new values")
        for i, (w, n) in enumerate(zip(windows, num_new)):
            if w.dim() != 2:
                raise ValueError(f"window {i} must be codes [num_quantizers, frames]; got shape {tuple(w.shape)}")
            if not 0 <= int(n) <= w.shape[-1]:
                raise ValueError(f"window {i}: num_new must be in 0..{w.shape[-1]} (the window's frames); got {n}")
        if len(windows) == 1:
            return [self.decode_window(windows[0][None], int(num_new[0]))[0]]
        if len({w.shape[0] for w in windows}) > 1:
            raise ValueError("the windows carry codes of different numbers of quantizers")
        lengths = [w.shape[-1] for w in windows]
        longest = max(lengths)
        device = windows[0].device
        codes = torch.stack([F.pad(w, (longest - w.shape[-1], 0)) for w in windows])
        self._check(codes)
        pads = [longest - n for n in lengths]
        news = [self.output_length(f) - self.output_length(f - int(n)) for f, n in zip(lengths, num_new)]
        x = self._transformer(self._embed(codes), torch.tensor(pads, device=device))
        # The convolutions run over the region every row needs: its new frames and the context their samples reach.
        firsts = [p + max(0, f - int(n) - self.conv_context_frames) for p, f, n in zip(pads, lengths, num_new)]
        first = min(firsts)
        wav = self._convs(x[..., first:], torch.tensor(firsts, device=device) - first)
        return [wav[i, :, wav.shape[-1] - n :] for i, n in enumerate(news)]

    def _check(self, codes: torch.Tensor) -> None:
        if codes.dim() != 3 or codes.dtype.is_floating_point or codes.dtype.is_complex or codes.dtype == torch.bool:
            raise ValueError(f"code2wav decodes integer codes [batch, num_quantizers, frames]; got {codes.dtype} {tuple(codes.shape)}")
        if codes.shape[1] != self.num_quantizers:
            raise ValueError(f"code2wav takes codes of all {self.num_quantizers} quantizers; got {codes.shape[1]}")
        bad = (codes < 0) | (codes >= self.codebook_size)
        if bool(bad.any()):
            b, q, t = (int(i) for i in bad.nonzero()[0])
            raise ValueError(
                f"code {int(codes[b, q, t])} (batch row {b}, quantizer {q}, frame {t}) is outside the codebook of {self.codebook_size} entries"
            )

    def _embed(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, T] -> [B, T, hidden]: the quantizers' embeddings averaged."""
        return F.embedding(codes + self.code_offset, self.embedding).mean(1)

    def _rms(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        dtype = h.dtype
        h = h.to(torch.float32)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + self.norm_eps)
        return weight * h.to(dtype)

    def _transformer(self, h: torch.Tensor, starts: torch.Tensor | None = None) -> torch.Tensor:
        """[B, T, hidden] -> [B, hidden, T]. starts [B] (decode_windows): where each row's own
        frames begin; before that a row is padding, which no position of the row attends."""
        steps = h.shape[1]
        cos, sin = window_rope(self.inv_freq, steps, starts, h.dtype, h.device)
        mask = window_mask(steps, self.window, starts, h.device)
        for w in self.layers:
            y = self._rms(h, w["input_layernorm"])
            h = h + w["attn_scale"] * window_attention(y, w, cos, sin, mask, self.heads, self.kv_heads, self.head_dim, self.scaling)
            y = self._rms(h, w["post_attention_layernorm"])
            h = h + w["mlp_scale"] * F.linear(self.act(F.linear(y, w["gate"])) * F.linear(y, w["up"]), w["down"])
        return self._rms(h, self.norm).permute(0, 2, 1)

    def _convs(self, x: torch.Tensor, starts: torch.Tensor | None = None) -> torch.Tensor:
        """Upsampling and decoder: [B, hidden, T] -> [B, 1, output_length(T)], clamped to [-1, 1].

        starts [B] (decode_windows): each row's first own step; every causal
        convolution sees zeros before it, as the left padding of a row decoded
        alone does, and the transposed convs scale it by their stride.
        """
        keep = None if starts is None else keep_mask(starts, x.shape[-1])

        def masked(y: torch.Tensor) -> torch.Tensor:
            return y if keep is None else y.masked_fill(~keep, 0.0)

        for up, block in self.upsample:
            x = _tconv(x, up)
            if starts is not None:
                starts = starts * up[2]
                keep = keep_mask(starts, x.shape[-1])
            x = _convnext(masked(x), x, block)
        x = _causal_conv(masked(x), self.decoder_in)
        for act, up, units in self.blocks:
            x = _tconv(_snake(x, act), up)
            if starts is not None:
                starts = starts * up[2]
                keep = keep_mask(starts, x.shape[-1])
            for act1, conv1, act2, conv2 in units:
                y = _causal_conv(masked(_snake(x, act1)), conv1)
                x = _causal_conv(_snake(y, act2), conv2) + x
        x = _causal_conv(masked(_snake(x, self.decoder_act)), self.decoder_out)
        return x.clamp(min=-1, max=1)


def _causal_conv(x: torch.Tensor, layer: tuple, groups: int = 1) -> torch.Tensor:
    """Qwen3OmniMoeCausalConvNet at stride 1: (kernel - 1) * dilation zeros on the left, none on the right."""
    weight, bias, dilation = layer
    x = F.pad(x, ((weight.shape[-1] - 1) * dilation, 0), mode="constant", value=0)
    return F.conv1d(x, weight, bias, 1, 0, dilation, groups).contiguous()


def _tconv(x: torch.Tensor, layer: tuple) -> torch.Tensor:
    """Qwen3OmniMoeCausalTransConvNet: the transposed conv, its first and last kernel - stride outputs trimmed."""
    weight, bias, stride, left, right = layer
    x = F.conv_transpose1d(x, weight, bias, stride=stride)
    return x[..., left : x.shape[-1] - right].contiguous()


def _convnext(x: torch.Tensor, residual: torch.Tensor, w: dict) -> torch.Tensor:
    """Qwen3OmniMoeConvNeXtBlock; x is its input with a batched row's padding zeroed, residual the input itself."""
    h = _causal_conv(x, w["dwconv"], groups=x.shape[1])
    h = h.permute(0, 2, 1)
    h = F.layer_norm(h, (h.shape[-1],), w["norm.weight"], w["norm.bias"], _CONVNEXT_EPS)
    h = F.gelu(F.linear(h, w["pwconv1.weight"], w["pwconv1.bias"]))
    h = F.linear(h, w["pwconv2.weight"], w["pwconv2.bias"])
    h = w["gamma"] * h
    return residual + h.permute(0, 2, 1)


def _snake(x: torch.Tensor, act: tuple) -> torch.Tensor:
    """Qwen3OmniMoeSnakeBeta: x + 1 / (exp(beta) + eps) * sin(x * exp(alpha)) ** 2."""
    alpha, inv_beta = act
    return x + inv_beta * torch.pow(torch.sin(x * alpha), 2)
