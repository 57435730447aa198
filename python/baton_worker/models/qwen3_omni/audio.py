"""Qwen3-Omni's audio input in plain PyTorch: the thinker's audio encoder (transformers'
Qwen3OmniMoeAudioEncoder, weights under `thinker.audio_tower.`), the processor's count of
<|audio_pad|> tokens, and the log-mel features (the processor's feature extractor is Whisper's).

Features: WhisperFeatureExtractor with no 30 s padding (the processor calls it with padding="longest",
truncation=False): a clip of n samples gives n // hop_length frames of feature_size mel bins, the Whisper
log-mel of whisper/features.py (LogMel.whole: the same STFT, filter bank and per-clip floor).
AudioFeatures returns each clip's features as the processor gives them for that clip alone. (The processor
pads a batch of clips to the longest one, so a shorter clip's last frames then see zeros instead of the
STFT's reflect padding, and a clip whose length is not a multiple of hop_length gets one more frame: its
features depend on the batch. Features here never do.)

Encoder, for each clip's [mel, frames] features:

  1. the frames are cut into chunks of 2 * n_window (100) frames, the last one shorter; a clip's chunks
     are zero-padded on the right to its longest chunk (100 frames, or the whole clip when it is shorter);
  2. three Conv2d (3x3, stride 2, padding 1) over (mel, time), each followed by exact GELU: a chunk of
     100 frames gives 13 positions; channels x reduced mel bins -> d_model by conv_out (no bias), over
     the padded positions too;
  3. plus a sinusoid table (positions restart at 0 in every chunk; computed as transformers does,
     not stored in the checkpoint); the padded positions are dropped, the clips' positions concatenated;
  4. pre-LayerNorm layers: self-attention within windows of n_window_infer // (2 n_window) chunks (104
     positions, 8 s; the last window of a clip shorter; windows never span two clips), then
     fc1 -> activation -> fc2, each with a residual;
  5. ln_post, proj1, activation, proj2 (d_model -> output_dim, the thinker's hidden size).

The output rows are the <|audio_pad|> embeddings in order, clip after clip: num_audio_tokens(frames) rows
for a clip. Everything follows transformers' operation order and layouts, so float32 results for a clip
alone are transformers' bits (get_audio_features with that clip's features).

Several clips run in one forward and each gets the rows it gets alone, which transformers' own batched
call does not give: it pads every chunk of the call to the longest, and the padding is not inert (past a
chunk's end the first conv gives gelu(bias + ...), which the next convs read), so a short clip's rows
change when a longer clip shares its call. Here clips are grouped by their own padding width; the convs
run in batches of at most conv_chunksize chunks, a chunk that transformers convolves as a batch of one
(the last of a clip of k * conv_chunksize + 1 chunks: a clip of at most 1 s) alone, since oneDNN rounds a
batch of one differently from larger batches (which agree with one another); the projections run once
over all positions; the windows of one length share an SDPA call. On CPU that is bit-equal to each clip
alone, except for clips under 4 tokens (under 0.25 s), whose projections alone take the BLAS path for
1-3 rows (float32 rounding apart).

transformers' windows are max_len_after_cnn * ratio positions, with max_len_after_cnn the longest chunk's
conv output in the call; it is 13 (104 positions) as soon as any clip has a full chunk, and otherwise every
clip is one chunk that fits in a window, so fixed 104-position windows are the same windows.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..llava.vision import activation
from ..whisper.features import LogMel

# Qwen3OmniMoeForConditionalGeneration keeps the encoder under thinker.audio_tower.
AUDIO_PREFIX = "thinker.audio_tower."
# nn.LayerNorm's default: the config has no field for it.
LAYER_NORM_EPS = 1e-5
# SinusoidsPositionEmbedding's default, which the encoder uses.
MAX_TIMESCALE = 10000

# Qwen3OmniMoeAudioEncoderConfig's defaults for what the encoder reads (a saved config may leave them out).
_DEFAULTS = {
    "num_mel_bins": 128,
    "encoder_layers": 32,
    "encoder_attention_heads": 20,
    "encoder_ffn_dim": 5120,
    "d_model": 1280,
    "activation_function": "gelu",
    "max_source_positions": 1500,
    "n_window": 50,
    "output_dim": 3584,
    "n_window_infer": 800,
    "conv_chunksize": 500,
    "downsample_hidden_size": 480,
}
_LAYER_WEIGHTS = (
    "self_attn_layer_norm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
    "final_layer_norm", "fc1", "fc2",
)  # fmt: skip


def audio_config(config: dict) -> dict:
    """The encoder's settings, defaults filled in, from Qwen3-Omni's config.json (thinker_config.audio_config),
    the thinker's config, or the audio config itself."""
    raw = config.get("thinker_config", config)
    raw = raw.get("audio_config", raw)
    return {**_DEFAULTS, **{k: v for k, v in raw.items() if v is not None}}


def _conv_length(frames: int) -> int:
    """Positions after the three stride-2 convs (kernel 3, padding 1): 100 frames -> 13, 0 -> 0."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1
    return frames


def num_audio_tokens(num_frames: int, n_window: int = 50) -> int:
    """<|audio_pad|> tokens (encoder output rows) for a clip of num_frames feature frames: 13 per full chunk
    of 2 * n_window frames plus the shorter last chunk's conv output. The processor's
    _get_feat_extract_output_lengths, whose 13 per chunk is this for the n_window of 50 it assumes."""
    chunk = 2 * n_window
    return (num_frames // chunk) * _conv_length(chunk) + _conv_length(num_frames % chunk)


def num_feature_frames(num_samples: int, hop_length: int = 160) -> int:
    """Feature frames (the ones of feature_attention_mask) the processor gives a clip of num_samples alone."""
    return num_samples // hop_length


def num_audio_tokens_for_samples(num_samples: int, hop_length: int = 160, n_window: int = 50) -> int:
    """<|audio_pad|> tokens the processor puts in the prompt for a clip of num_samples (processed alone)."""
    return num_audio_tokens(num_feature_frames(num_samples, hop_length), n_window)


def _feature_extractor_config(model_dir: Path) -> dict:
    """The feature extractor's fields: processor_config.json's `feature_extractor` (transformers 5's layout)
    or preprocessor_config.json (the hub's)."""
    model_dir = Path(model_dir)
    processor = model_dir / "processor_config.json"
    if processor.exists():
        cfg = json.loads(processor.read_text()).get("feature_extractor")
        if cfg is not None:
            return cfg
    pre = model_dir / "preprocessor_config.json"
    if pre.exists():
        return json.loads(pre.read_text())
    raise ValueError(f"{model_dir} has no feature extractor config (processor_config.json or preprocessor_config.json)")


class AudioFeatures:
    """Mono clips at sampling_rate -> each clip's input_features [feature_size, frames], as Qwen3OmniMoeProcessor
    gives them for the clip alone (feature_attention_mask all ones: frames = num_samples // hop_length)."""

    def __init__(self, log_mel: LogMel):
        self.log_mel = log_mel

    @classmethod
    def from_dir(cls, model_dir: Path | str, device: torch.device | str = "cpu") -> AudioFeatures:
        cfg = _feature_extractor_config(Path(model_dir))
        kind = cfg.get("feature_extractor_type", "WhisperFeatureExtractor")
        if kind != "WhisperFeatureExtractor":
            raise ValueError(f"Qwen3-Omni's audio features are WhisperFeatureExtractor's; the config names {kind}")
        if float(cfg.get("dither", 0.0)) != 0.0:
            raise ValueError("the feature extractor asks for dither; Baton's audio features are deterministic")
        if cfg.get("do_normalize"):
            raise ValueError("the feature extractor asks for do_normalize, which Qwen3-Omni does not use")
        return cls(
            LogMel(
                feature_size=int(cfg.get("feature_size", 128)),
                sampling_rate=int(cfg.get("sampling_rate", 16000)),
                n_fft=int(cfg.get("n_fft", 400)),
                hop_length=int(cfg.get("hop_length", 160)),
                chunk_length=int(cfg.get("chunk_length", 300)),
                padding_value=float(cfg.get("padding_value", 0.0)),
                device=device,
            )
        )

    @property
    def sampling_rate(self) -> int:
        return self.log_mel.sampling_rate

    @property
    def hop_length(self) -> int:
        return self.log_mel.hop_length

    def num_frames(self, num_samples: int) -> int:
        return num_feature_frames(num_samples, self.log_mel.hop_length)

    def __call__(self, clips: Sequence[np.ndarray]) -> list[torch.Tensor]:
        out = []
        for clip in clips:
            clip = np.asarray(clip, dtype=np.float32)
            if clip.ndim != 1:
                raise ValueError(f"audio features take mono clips (1-D arrays); got shape {clip.shape}")
            if clip.shape[0] <= self.log_mel.n_fft // 2:
                raise ValueError(f"a clip needs more than {self.log_mel.n_fft // 2} samples; got {clip.shape[0]}")
            out.append(self.log_mel.whole(clip))
        return out


def processor_features(input_features: torch.Tensor, feature_attention_mask: torch.Tensor) -> list[torch.Tensor]:
    """The processor's batch (input_features [clips, mel, frames], feature_attention_mask [clips, frames]) ->
    each clip's [mel, frames] features: the frames its mask keeps, as get_audio_features selects them."""
    return [f[:, m.bool()] for f, m in zip(input_features, feature_attention_mask)]


def _sinusoids(length: int, channels: int, max_timescale: int = MAX_TIMESCALE) -> torch.Tensor:
    """SinusoidsPositionEmbedding's table, computed as transformers computes it (on the CPU, float32)."""
    log_timescale_increment = np.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-log_timescale_increment * torch.arange(channels // 2).float())
    scaled_time = torch.arange(length)[:, np.newaxis] * inv_timescales[np.newaxis, :]
    return torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)


class Qwen3OmniAudioEncoder(torch.nn.Module):
    """Clips' features ([mel, frames] each) -> the audio embeddings [sum of num_tokens(frames), output_dim].

    `get(name)` returns a tensor of the checkpoint (already on its device and dtype); `config` is config.json's
    dict (or the thinker's, or the audio config)."""

    def __init__(self, get: Callable[[str], torch.Tensor], config: dict, prefix: str = AUDIO_PREFIX):
        super().__init__()
        c = audio_config(config)
        p = prefix
        self.num_mel_bins = int(c["num_mel_bins"])
        self.d_model = int(c["d_model"])
        self.heads = int(c["encoder_attention_heads"])
        if self.d_model % self.heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of encoder_attention_heads {self.heads}")
        self.head_dim = self.d_model // self.heads
        self.scaling = self.head_dim**-0.5
        self.output_dim = int(c["output_dim"])
        self.n_window = int(c["n_window"])
        self.chunk_frames = 2 * self.n_window
        self.chunk_tokens = _conv_length(self.chunk_frames)
        ratio = int(c["n_window_infer"]) // self.chunk_frames
        if ratio < 1:
            raise ValueError(f"n_window_infer {c['n_window_infer']} is shorter than a chunk of {self.chunk_frames} frames")
        self.window_tokens = self.chunk_tokens * ratio
        self.conv_chunksize = int(c["conv_chunksize"])
        self.act = activation(c["activation_function"])
        self.convs = [(get(f"{p}conv2d{i}.weight"), get(f"{p}conv2d{i}.bias")) for i in (1, 2, 3)]
        self.conv_out = get(p + "conv_out.weight")
        dtype, device = self.conv_out.dtype, self.conv_out.device
        self.positions = _sinusoids(int(c["max_source_positions"]), self.d_model).to(device=device, dtype=dtype)
        self.layers = []
        for i in range(int(c["encoder_layers"])):
            q = f"{p}layers.{i}."
            self.layers.append({n: (get(q + n + ".weight"), get(q + n + ".bias")) for n in _LAYER_WEIGHTS})
        self.ln_post = (get(p + "ln_post.weight"), get(p + "ln_post.bias"))
        self.proj1 = (get(p + "proj1.weight"), get(p + "proj1.bias"))
        self.proj2 = (get(p + "proj2.weight"), get(p + "proj2.bias"))

    def num_tokens(self, num_frames: int) -> int:
        """Output rows (<|audio_pad|> tokens) for a clip of num_frames feature frames."""
        return num_audio_tokens(num_frames, self.n_window)

    @torch.inference_mode()
    def forward(self, features: Sequence[torch.Tensor]) -> torch.Tensor:
        features = list(features)
        for f in features:
            if f.dim() != 2 or f.shape[0] != self.num_mel_bins:
                raise ValueError(f"each clip's features must be [{self.num_mel_bins}, frames]; got {tuple(f.shape)}")
        dtype, device = self.conv_out.dtype, self.conv_out.device
        clip_tokens = [self.num_tokens(f.shape[1]) for f in features]
        # 1-3 per padding width: a clip's chunks are padded to its longest chunk, as transformers pads them for
        # the clip alone (the padding is not inert: past a chunk's end the first conv gives gelu(bias + ...),
        # which the next convs read, so a short chunk padded further would give other values).
        groups: dict[int, list[int]] = {}
        for i, f in enumerate(features):
            if f.shape[1]:
                groups.setdefault(min(f.shape[1], self.chunk_frames), []).append(i)
        rows: list[torch.Tensor | None] = [None] * len(features)
        for clips in groups.values():
            for i, r in zip(clips, self._embed([features[i] for i in clips]).split([clip_tokens[i] for i in clips])):
                rows[i] = r
        if not groups:
            return torch.zeros(0, self.output_dim, dtype=dtype, device=device)
        h = torch.cat([r for r in rows if r is not None])
        # 4. The layers, attention within each clip's windows.
        windows = self._windows(clip_tokens)
        for w in self.layers:
            residual = h
            y = F.layer_norm(h, h.shape[-1:], *w["self_attn_layer_norm"], LAYER_NORM_EPS)
            h = residual + F.linear(self._attention(y, w, windows), *w["self_attn.out_proj"])
            residual = h
            y = F.layer_norm(h, h.shape[-1:], *w["final_layer_norm"], LAYER_NORM_EPS)
            h = residual + F.linear(self.act(F.linear(y, *w["fc1"])), *w["fc2"])
        # 5. The output projection.
        h = F.layer_norm(h, h.shape[-1:], *self.ln_post, LAYER_NORM_EPS)
        return F.linear(self.act(F.linear(h, *self.proj1)), *self.proj2)

    def _embed(self, features: Sequence[torch.Tensor]) -> torch.Tensor:
        """Clips whose longest chunks have the same length -> their conv embeddings plus positions, concatenated."""
        dtype, device = self.conv_out.dtype, self.conv_out.device
        # 1. Chunks of chunk_frames (the last of a clip shorter), zero-padded to the longest, laid out as
        # transformers lays them out ([chunks, mel, time] as a transpose of [chunks, time, mel]).
        chunk_lengths: list[int] = []
        pieces: list[torch.Tensor] = []
        alone: list[int] = []
        for f in features:
            frames = f.shape[1]
            lengths = [self.chunk_frames] * (frames // self.chunk_frames)
            if frames % self.chunk_frames:
                lengths.append(frames % self.chunk_frames)
            if len(lengths) % self.conv_chunksize == 1 or self.conv_chunksize == 1:
                alone.append(len(chunk_lengths) + len(lengths) - 1)
            chunk_lengths += lengths
            pieces += f.T.split(lengths, dim=0)
        padded = torch.nn.utils.rnn.pad_sequence(pieces, batch_first=True).transpose(1, 2)
        # 2. The convolutions; conv_out over every (padded) position.
        x = self._convs(padded.unsqueeze(1).to(device=device, dtype=dtype), alone)
        b, c, f, t = x.size()
        x = F.linear(x.permute(0, 3, 1, 2).contiguous().view(b, t, c * f), self.conv_out)
        # 3. Positions per chunk; the padded positions dropped.
        x = x + self.positions[:t].unsqueeze(0)
        lengths_after = torch.tensor([_conv_length(n) for n in chunk_lengths], device=device)
        valid = (torch.arange(t, device=device) < lengths_after.unsqueeze(1)).flatten().nonzero().squeeze(-1)
        return torch.index_select(x.reshape(-1, x.shape[-1]), 0, valid)

    def _convs(self, x: torch.Tensor, alone: Sequence[int]) -> torch.Tensor:
        """The three convs over chunks x [chunks, 1, mel, width], in batches of at most conv_chunksize chunks.

        transformers convolves a clip's chunks conv_chunksize at a time, so the last chunk of a clip of
        k * conv_chunksize + 1 chunks (one chunk, mostly) runs as a batch of one, and oneDNN's batch-of-one
        convolutions round differently from its larger batches (which agree with one another): the chunks
        listed in `alone` run alone, the others in batches of two or more."""
        n = x.shape[0]
        alone_set = set(alone)
        rest = [i for i in range(n) if i not in alone_set]
        parts = [rest[i : i + self.conv_chunksize] for i in range(0, len(rest), self.conv_chunksize)]
        if len(parts) > 1 and len(parts[-1]) == 1:
            parts[-1].insert(0, parts[-2].pop())
        parts += [[i] for i in alone]
        if len(parts) == 1 and parts[0] == list(range(n)):
            ordered = x
        else:
            order = [i for part in parts for i in part]
            ordered = x.index_select(0, torch.tensor(order, device=x.device))
        out = []
        for part in ordered.split([len(part) for part in parts], dim=0):
            for w, b in self.convs:
                part = F.gelu(F.conv2d(part, w, b, stride=2, padding=1))
            out.append(part)
        y = torch.cat(out, dim=0)
        if ordered is x:
            return y
        inverse = torch.empty(n, dtype=torch.long, device=x.device)
        inverse[torch.tensor(order, device=x.device)] = torch.arange(n, device=x.device)
        return y.index_select(0, inverse)

    def _windows(self, clip_tokens: Sequence[int]) -> dict[int, list[int]]:
        """Attention windows as {length: [start row, ...]}: each clip's rows cut into window_tokens, the last shorter."""
        windows: dict[int, list[int]] = {}
        start = 0
        for n in clip_tokens:
            for s in range(start, start + n, self.window_tokens):
                windows.setdefault(min(self.window_tokens, start + n - s), []).append(s)
            start += n
        return windows

    def _attention(self, y: torch.Tensor, w: dict, windows: dict[int, list[int]]) -> torch.Tensor:
        n = y.shape[0]
        # [1, heads, rows, head_dim] views of [rows, heads, head_dim], as transformers lays them out.
        q, k, v = (
            F.linear(y, *w[f"self_attn.{name}_proj"]).reshape(n, self.heads, -1).transpose(0, 1).unsqueeze(0)
            for name in "qkv"
        )
        out = torch.empty(n, self.heads, self.head_dim, dtype=y.dtype, device=y.device)
        for length, starts in windows.items():
            if len(starts) == 1:
                s = starts[0]
                o = F.scaled_dot_product_attention(
                    q[:, :, s : s + length], k[:, :, s : s + length], v[:, :, s : s + length], scale=self.scaling
                )
                out[s : s + length] = o[0].transpose(0, 1)
            else:
                rows = (torch.tensor(starts, device=y.device)[:, None] + torch.arange(length, device=y.device)).flatten()
                # [1, heads, windows * length, head_dim] -> [windows, heads, length, head_dim]
                qs, ks, vs = (
                    t.index_select(1, rows).view(self.heads, len(starts), length, self.head_dim).transpose(0, 1)
                    for t in (q[0], k[0], v[0])
                )
                o = F.scaled_dot_product_attention(qs, ks, vs, scale=self.scaling)
                out[rows] = o.permute(0, 2, 1, 3).reshape(-1, self.heads, self.head_dim)
        return out.reshape(n, self.d_model)
