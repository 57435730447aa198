"""Sesame's CSM (transformers' CsmForConditionalGeneration) for the worker's step
machinery: the backbone over the paged KV cache, batched across requests like
any decoder, and the depth decoder run for every row that sampled in a step at once.

    backbone = CsmBackbone(reader, config)          # or load_csm(model_dir, dtype, device)
    depth = CsmDepthDecoder(reader, config)
    x = backbone.embed(frames)                       # frames [T, K+1] -> [T, H]
    hidden = backbone.hidden_states_from_embeds(x, positions, attention)
    h = backbone.head_input(hidden, last_indices)    # [R, H]: final-norm rows of the rows that sample
    c0 = sample(backbone.codebook0_logits(h), 0)     # float32 [R, V] -> [R]
    codes = depth.frames(h, c0, sample)              # [R, K]: the rows' next frames
    done = frame_stops(codes)                        # [R]

A step's input is FRAMES, not token ids: one row [K+1] per position, columns
0..K-1 the codebook ids, column K a text id. A text position (codes -1)
embeds its text id with embed_text_tokens; an audio position (codes >= 0; its
text column is ignored: -1 or a pad) embeds the sum over k of
embed_audio_tokens[k * V + code_k] (CsmBackboneModelEmbeddings). A prompt's
<|AUDIO|> positions carry their context frame's codes and <|audio_eos|> the
all-zero frame (prompt_frames builds them from the processor's input_ids and the
codec's codes, as transformers merges them); a generated frame goes back in as
audio_frames(codes).

The backbone is model/decoder.py's DecoderModel (a Llama stack: its weights are
the checkpoint's backbone_model.* names, its embedding table embed_text_tokens,
no vocabulary head of its own) fed through its `replace` path: every new
position's row stands in for a dummy token's embedding (hidden_states_from_embeds),
or only the audio rows do and text ids embed as usual (hidden_states(frames, ...)).
codebook0_logits is lm_head over the final-norm output h, which also starts the
depth decoder, as transformers' generate passes the last hidden state (after the
norm) to it.

The depth decoder is a second DecoderModel (depth_decoder.model.*) whose attention
is a dense per-frame cache [layers, R, kv_heads, K, head_dim] that starts empty
for every frame (FrameAttention), so every row of a step goes through one forward
per codebook: position 0 is h, position 1 code 0's embedding, position k + 1
codebook k's (offset k * V in the depth decoder's own table), each through
inputs_embeds_projector; the final-norm output at position k times
codebooks_head[k - 1] scores codebook k, and `sample(logits, k)` picks it.

Arithmetic follows transformers' order (float32 RMSNorm, rotate_half RoPE from the
same inverse frequencies, residual adds in the same places, lm_head and the
codebook heads as linear maps of the normed rows, the logits cast to float32 after
the product), so greedy codes equal CsmForConditionalGeneration.generate's token
for token in float32; attention goes through the paged backend (an additive mask
rather than is_causal), so hidden states agree to rounding, not to the bit.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from ...model.config import ConfigError, ModelConfig, read_json, stack_config
from ...model.decoder import DecoderModel
from ...model.weights import WeightReader

ARCHITECTURE = "CsmForConditionalGeneration"
TEXT_TABLE = "embed_text_tokens.weight"
BACKBONE_TABLE = "backbone_model.embed_tokens.embed_audio_tokens.weight"
DEPTH_TABLE = "depth_decoder.model.embed_tokens.weight"
_DECODER_EMBED = "model.embed_tokens.weight"  # what DecoderModel asks for

# Sampler: (float32 logits [R, V], codebook index) -> ids [R].
Sample = Callable[[torch.Tensor, int], torch.Tensor]


class Reader(Protocol):
    """WeightReader's interface (stored names)."""

    dtype: torch.dtype
    device: torch.device

    def get(self, name: str) -> torch.Tensor: ...

    def has(self, name: str) -> bool: ...


def greedy(logits: torch.Tensor, k: int) -> torch.Tensor:
    """The argmax sampler (transformers' do_sample=False / depth_decoder_do_sample=False)."""
    return logits.argmax(dim=-1)


def frame_stops(frames: torch.Tensor, eos: int = 0) -> torch.Tensor:
    """frames [R, K] -> bool [R]: the frame ends the stream (codebooks 0..K-2 all `eos`, the config's
    codebook_eos_token_id; the last codebook is not looked at), as transformers' generate stops."""
    return (frames[:, :-1] == eos).all(dim=-1)


def _stack_config(raw: dict[str, Any], what: str) -> ModelConfig:
    """One Llama stack of CSM (CsmConfig's top level, or its depth_decoder_config); missing fields take
    CsmConfig's defaults."""
    return stack_config(raw, what, ARCHITECTURE, qk_norm=False, rms_norm_eps=1e-5, max_positions=2048,
                        mlp_bias=bool(raw.get("mlp_bias", False)))


def csm_backbone_config(config: dict[str, Any]) -> ModelConfig:
    """The backbone's shape (config.json's top level): what sizes the paged KV cache. vocab_size is the
    codebook vocabulary (lm_head's rows), not the text vocabulary."""
    return _stack_config(config, "config.json")


def csm_depth_config(config: dict[str, Any]) -> ModelConfig:
    depth = config.get("depth_decoder_config")
    if not isinstance(depth, dict):
        raise ConfigError("config.json has no depth_decoder_config object")
    return _stack_config(depth, "depth_decoder_config")


def backbone_rename(name: str) -> str:
    """DecoderModel's weight names -> the checkpoint's for the backbone (a KvDecoderLayout-style rename)."""
    if name == _DECODER_EMBED:
        return TEXT_TABLE
    if name.startswith("model."):
        return "backbone_model." + name.removeprefix("model.")
    return name  # lm_head.weight


class _Stack:
    """A DecoderModel's view of one stack of a CSM checkpoint: `model.*` names under `prefix`, the
    embedding table given (or read under another name)."""

    def __init__(self, reader: Reader, prefix: str, embed: torch.Tensor | str):
        self.reader, self.prefix, self.embed = reader, prefix, embed
        self.dtype, self.device = reader.dtype, reader.device

    def _name(self, name: str) -> str:
        return self.prefix + name.removeprefix("model.") if name.startswith("model.") else name

    def has(self, name: str) -> bool:
        return name == _DECODER_EMBED or self.reader.has(self._name(name))

    def get(self, name: str) -> torch.Tensor:
        if name == _DECODER_EMBED:
            return self.embed if isinstance(self.embed, torch.Tensor) else self.reader.get(self.embed)
        return self.reader.get(self._name(name))


def read_codebook_tables(reader: Reader) -> tuple[torch.Tensor, torch.Tensor]:
    """(backbone's, depth decoder's) codebook tables [K * V, backbone hidden]. transformers keeps two
    weights (its _tied_weights_keys apply only with tie_word_embeddings, which CsmConfig forbids); a
    writer that dedupes them leaves one, which then serves both, and equal tables are kept once."""
    has_backbone, has_depth = reader.has(BACKBONE_TABLE), reader.has(DEPTH_TABLE)
    if not (has_backbone or has_depth):
        raise ConfigError(f"neither {BACKBONE_TABLE!r} nor {DEPTH_TABLE!r} is in the model's safetensors files")
    backbone = reader.get(BACKBONE_TABLE if has_backbone else DEPTH_TABLE)
    if not (has_backbone and has_depth):
        return backbone, backbone
    depth = reader.get(DEPTH_TABLE)
    return (backbone, backbone) if torch.equal(backbone, depth) else (backbone, depth)


class CsmBackbone:
    """The backbone: frames in, the residual stream over the paged KV cache, codebook-0 logits.

    reader: a WeightReader (or alike) over the directory's stored names; config: config.json's dict.
    table: the codebook table if already read (load_csm shares it with the depth decoder)."""

    def __init__(self, reader: Reader, config: dict[str, Any], fuse: bool = True, table: torch.Tensor | None = None):
        self.config = csm_backbone_config(config)
        self.num_codebooks = int(config.get("num_codebooks", 32))
        self.vocab_size = self.config.vocab_size  # codebook ids 0..V-1
        self.audio_token_id = int(config.get("audio_token_id", 128002))
        self.audio_eos_token_id = int(config.get("audio_eos_token_id", 128003))
        self.eos = int(config.get("codebook_eos_token_id", 0))
        self.device, self.dtype = reader.device, reader.dtype
        # The text table is the decoder's embedding; no head of its own (lm_head is read here).
        self.decoder = DecoderModel(self.config, _Stack(reader, "backbone_model.", TEXT_TABLE), fuse=fuse, head=False)
        self.text_table = self.decoder.embed
        self.table = table if table is not None else read_codebook_tables(reader)[0]
        self.lm_head = reader.get("lm_head.weight")
        self.offsets = torch.arange(self.num_codebooks, device=self.device) * self.vocab_size
        self.scale = self.decoder.scale  # for make_backend
        if self.table.shape != (self.num_codebooks * self.vocab_size, self.config.hidden_size):
            raise ConfigError(f"codebook table {tuple(self.table.shape)} is not num_codebooks * vocab_size x hidden_size")

    def weight_bytes(self) -> int:
        return self.decoder.weight_bytes() + sum(t.numel() * t.element_size() for t in (self.table, self.lm_head))

    def frame_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [N, K] -> [N, hidden]: the sum of each codebook's row (offsets k * V)."""
        return F.embedding(codes.to(self.device) + self.offsets, self.table).sum(dim=1)

    def _audio_rows(self, frames: torch.Tensor) -> torch.Tensor:
        if frames.dim() != 2 or frames.shape[1] != self.num_codebooks + 1:
            raise ValueError(f"frames must be [T, {self.num_codebooks + 1}], got {tuple(frames.shape)}")
        return (frames[:, 0] >= 0).nonzero()[:, 0]

    @torch.inference_mode()
    def embed(self, frames: torch.Tensor) -> torch.Tensor:
        """frames [T, K+1] -> the backbone's input rows [T, hidden] (text rows: embed_text_tokens; audio
        rows: the frame embedding)."""
        frames = frames.to(self.device)
        audio = self._audio_rows(frames)
        x = F.embedding(frames[:, -1].clamp(min=0), self.text_table)
        if audio.numel():
            x.index_copy_(0, audio, self.frame_embedding(frames.index_select(0, audio)[:, :-1]))
        return x

    @torch.inference_mode()
    def hidden_states_from_embeds(self, embeds: torch.Tensor, positions: torch.Tensor, attention) -> torch.Tensor:
        """Input rows [T, hidden] at `positions` [T] (every row's new positions of the step, flat) -> the
        residual stream [T, hidden] after the last layer (before the final norm), through the paged KV
        cache (attention: the backend's prepare() for the step). DecoderModel has no inputs_embeds entry,
        so every row replaces a dummy token's embedding."""
        t = embeds.shape[0]
        ids = torch.zeros(t, dtype=torch.int64, device=self.device)
        index = torch.arange(t, device=self.device)
        return self.decoder.hidden_states(ids, positions.to(self.device), attention, replace=(index, embeds))

    @torch.inference_mode()
    def hidden_states(self, frames: torch.Tensor, positions: torch.Tensor, attention) -> torch.Tensor:
        """hidden_states_from_embeds(embed(frames), ...) without building every row twice: text ids go
        through the decoder's embedding, only audio rows are replaced. The same values."""
        frames = frames.to(self.device)
        audio = self._audio_rows(frames)
        replace = (audio, self.frame_embedding(frames.index_select(0, audio)[:, :-1])) if audio.numel() else None
        return self.decoder.hidden_states(frames[:, -1].clamp(min=0), positions.to(self.device), attention, replace=replace)

    @torch.inference_mode()
    def head_input(self, hidden: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """The rows at `indices` through the final norm: h, what lm_head scores and the depth decoder starts from."""
        return self.decoder.head_input(hidden, indices.to(self.device))

    @torch.inference_mode()
    def codebook0_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final-norm rows h [R, hidden] (head_input) -> float32 codebook-0 logits [R, V] (lm_head)."""
        return F.linear(h, self.lm_head).float()


class FrameAttention:
    """The depth decoder's attention for R rows over one frame: a dense cache
    [layers, R, kv_heads, length, head_dim], written at the positions of each
    forward (advance(n): the next n positions of every row; the first may hold
    several, causal among themselves) and attended whole. A StepAttention."""

    def __init__(self, layers: int, rows: int, length: int, heads: int, kv_heads: int, head_dim: int, scale: float,
                 dtype: torch.dtype, device: torch.device):
        shape = (layers, rows, kv_heads, length, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.rows, self.heads, self.kv_heads, self.head_dim, self.scale = rows, heads, kv_heads, head_dim, scale
        self.start, self.n = 0, 0

    def advance(self, n: int) -> FrameAttention:
        self.start += self.n
        if n > 1 and self.start:
            raise ValueError("several positions per row only at the start of a frame")
        if self.start + n > self.k.shape[3]:
            raise ValueError(f"position {self.start + n - 1} is past the frame's {self.k.shape[3]} positions")
        self.n = n
        return self

    def run(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [R * n, heads, d], k and v [R * n, kv_heads, d], each row's n positions contiguous -> [R * n, heads, d]."""
        r, n, s, d = self.rows, self.n, self.start, self.head_dim
        self.k[layer, :, :, s : s + n] = k.view(r, n, self.kv_heads, d).transpose(1, 2)
        self.v[layer, :, :, s : s + n] = v.view(r, n, self.kv_heads, d).transpose(1, 2)
        keys, values = self.k[layer, :, :, : s + n], self.v[layer, :, :, : s + n]
        queries = q.view(r, n, self.heads, d).transpose(1, 2)
        out = F.scaled_dot_product_attention(queries, keys, values, is_causal=n > 1, scale=self.scale,
                                             enable_gqa=self.heads != self.kv_heads)
        return out.transpose(1, 2).reshape(r * n, self.heads, d)


class CsmDepthDecoder:
    """The depth decoder: a frame's codebooks 1..K-1 from the backbone's h and codebook 0, for many rows at once.

    reader: stored names, as CsmBackbone's; table: the depth decoder's codebook table if already read."""

    def __init__(self, reader: Reader, config: dict[str, Any], fuse: bool = True, table: torch.Tensor | None = None):
        self.config = csm_depth_config(config)
        depth = config["depth_decoder_config"]
        self.num_codebooks = int(depth.get("num_codebooks", config.get("num_codebooks", 32)))
        self.vocab_size = self.config.vocab_size
        self.device, self.dtype = reader.device, reader.dtype
        c = self.config
        # Its inputs come through inputs_embeds_projector, so the decoder's own table is a placeholder row.
        placeholder = torch.zeros(1, c.hidden_size, dtype=self.dtype, device=self.device)
        self.decoder = DecoderModel(c, _Stack(reader, "depth_decoder.model.", placeholder), fuse=fuse, head=False)
        self.table = table if table is not None else read_codebook_tables(reader)[1]  # [K * V, backbone hidden]
        self.projector = reader.get("depth_decoder.model.inputs_embeds_projector.weight")  # [hidden, backbone hidden]
        self.heads = reader.get("depth_decoder.codebooks_head.weight")  # [K - 1, hidden, V]
        if self.heads.shape != (self.num_codebooks - 1, c.hidden_size, self.vocab_size):
            raise ConfigError(f"codebooks_head {tuple(self.heads.shape)} is not (num_codebooks - 1) x hidden_size x vocab_size")
        # Positions are 0..K-1 in every frame: their rotary tables once (cos_sin is per position, the same bits).
        self.cos, self.sin = self.decoder.rotary.cos_sin(torch.arange(self.num_codebooks + 1, device=self.device), self.dtype)
        # On the CPU a frame's K-1 forwards are small and many: a layer loop with fewer operations (_hidden).
        self.lean = fuse and self.decoder.ops.name == "torch" and not c.qk_norm and self.decoder.tp is None

    def weight_bytes(self) -> int:
        return self.decoder.weight_bytes() + sum(t.numel() * t.element_size() for t in (self.table, self.projector, self.heads))

    def attention(self, rows: int) -> FrameAttention:
        """A fresh frame cache for `rows` rows (positions 0..K-1)."""
        c = self.config
        return FrameAttention(c.num_layers, rows, self.num_codebooks, c.num_heads, c.num_kv_heads, c.head_dim,
                              self.decoder.scale, self.dtype, self.device)

    @torch.inference_mode()
    def frames(self, h: torch.Tensor, c0: torch.Tensor, sample: Sample = greedy) -> torch.Tensor:
        """h [R, backbone hidden] (CsmBackbone.head_input), codebook 0 [R] -> the frames [R, K] (column 0 is
        c0). One forward per codebook for all R rows; sample(float32 logits [R, V], k) picks codebook k."""
        r, K, V = h.shape[0], self.num_codebooks, self.vocab_size
        device = self.device
        c0 = c0.to(device=device, dtype=torch.int64)
        codes = torch.empty(r, K, dtype=torch.int64, device=device)
        codes[:, 0] = c0
        if r == 0 or K == 1:
            return codes
        attention = self.attention(r)
        # Position 0: h; position 1: code 0 (offset 0). Rows' positions contiguous in the flat batch.
        x = torch.stack((h.to(self.dtype), F.embedding(c0, self.table)), dim=1).reshape(2 * r, -1)
        positions = torch.arange(2, device=device).repeat(r)
        last = torch.arange(1, 2 * r, 2, device=device)
        dummy = torch.zeros(2 * r, dtype=torch.int64, device=device)
        for k in range(1, K):
            n = x.shape[0]
            inputs = F.linear(x, self.projector)
            if self.lean:
                first = n > r
                cos = self.cos.index_select(0, positions) if first else self.cos[k].expand(r, -1)
                sin = self.sin.index_select(0, positions) if first else self.sin[k].expand(r, -1)
                hidden = self._hidden(inputs, cos, sin, attention.advance(n // r))
                out = self.decoder.head_input(hidden, last) if first else self.decoder.ops.rms_norm(hidden, self.decoder.norm)
            else:
                hidden = self.decoder.hidden_states(dummy[:n], positions, attention.advance(n // r),
                                                    replace=(torch.arange(n, device=device), inputs))
                out = self.decoder.head_input(hidden, last)
            logits = F.linear(out, self.heads[k - 1].T).float()
            codes[:, k] = sample(logits, k).to(device=device, dtype=torch.int64).reshape(r)
            if k + 1 < K:
                # Codebook k goes in at position k + 1 with its offset.
                x = F.embedding(codes[:, k] + k * V, self.table)
                positions = torch.full((r,), k + 1, dtype=torch.int64, device=device)
                last = torch.arange(r, device=device)
        return codes


    def _hidden(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: FrameAttention) -> torch.Tensor:
        """DecoderModel.hidden_states' arithmetic for input rows x (no embedding, no replace), with q and k
        rotated in one call: the same operations on the same values, fewer of them."""
        d, c = self.decoder, self.config
        ops, t = d.ops, x.shape[0]
        q_heads, kv_heads, dim = c.num_heads, c.num_kv_heads, c.head_dim
        qk = (q_heads + kv_heads) * dim
        delta = None
        for i, layer in enumerate(d.layers):
            if delta is None:
                h = ops.rms_norm(x, layer.input_norm)
            else:
                x, h = ops.add_rms_norm(x, delta, layer.input_norm)
            qkv = F.linear(h, layer.qkv[0], layer.qkv_bias[0])
            rotated = ops.rotary(qkv[:, :qk].view(t, q_heads + kv_heads, dim), cos, sin)
            # Contiguous, as separate rotations leave them: attention's kernel may sum in another order otherwise.
            q, k = (part.contiguous() for part in rotated.split((q_heads, kv_heads), dim=1))
            out = attention.run(i, q, k, qkv[:, qk:].view(t, kv_heads, dim)).reshape(t, q_heads * dim)
            x, h = ops.add_rms_norm(x, F.linear(out, layer.o_proj, layer.o_bias), layer.post_norm)
            delta = F.linear(ops.silu_mul(F.linear(h, layer.gate_up[0], layer.gate_up_bias[0])), layer.down_proj, layer.down_bias)
        return x + delta


def audio_frames(codes: torch.Tensor) -> torch.Tensor:
    """Codes [N, K] -> frames [N, K+1] (text column -1): generated or context frames as backbone input."""
    return torch.cat((codes.long(), torch.full((codes.shape[0], 1), -1, dtype=torch.int64, device=codes.device)), dim=1)


def prompt_frames(input_ids: torch.Tensor, audio_codes: torch.Tensor | list[torch.Tensor] | None, config: dict[str, Any]) -> torch.Tensor:
    """The processor's input_ids [T] and the context audio's codes ([N, K], the utterances' frames in
    order; None: no audio) -> frames [T, K+1]: every position keeps its text id; the i-th <|AUDIO|> carries
    context frame i and every <|audio_eos|> the all-zero frame (codebook_eos_token_id), as transformers
    merges them; with no audio both keep their text embedding, as in transformers."""
    K = int(config.get("num_codebooks", 32))
    ids = input_ids.reshape(-1).long().cpu()
    frames = torch.full((ids.shape[0], K + 1), -1, dtype=torch.int64)
    frames[:, K] = ids
    if audio_codes is None or (isinstance(audio_codes, list) and not audio_codes):
        return frames
    codes = torch.cat(list(audio_codes)) if isinstance(audio_codes, list) else audio_codes
    codes = codes.long().cpu()
    audio = ids == int(config.get("audio_token_id", 128002))
    if int(audio.sum()) != codes.shape[0] or codes.shape[1:] != (K,):
        raise ValueError(f"{int(audio.sum())} <|AUDIO|> positions but audio codes of shape {tuple(codes.shape)} (K = {K})")
    frames[audio, :K] = codes
    frames[ids == int(config.get("audio_eos_token_id", 128003)), :K] = int(config.get("codebook_eos_token_id", 0))
    return frames


def load_csm(model_dir: Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
             fuse: bool = True) -> tuple[CsmBackbone, CsmDepthDecoder]:
    """Both stacks from a directory (one reader; equal codebook tables kept once)."""
    model_dir = Path(model_dir)
    config = read_json(model_dir / "config.json")
    reader = WeightReader(model_dir, dtype, torch.device(device))
    try:
        backbone_table, depth_table = read_codebook_tables(reader)
        backbone = CsmBackbone(reader, config, fuse=fuse, table=backbone_table)
        depth = CsmDepthDecoder(reader, config, fuse=fuse, table=depth_table)
    finally:
        reader.close()
    return backbone, depth
