"""CSM's generation loop in plain PyTorch over a directory's weights: what Baton's served codes are checked against.

Library:  generate_codes(model_dir, input_ids, max_new_frames, audio_codes=None, ...) -> LongTensor [frames, K]
          CsmReference(model_dir).generate(input_ids, max_new_frames, audio_codes=None, ...)

It reads config.json and model.safetensors itself (no transformers module) and
follows CsmForConditionalGeneration.generate step for step, so greedy codes
equal transformers' and seeded sampling draws the same numbers in the same
order (one multinomial for codebook 0, then one per depth step):

- Prompt: the processor's input_ids [T] (text ids; <|AUDIO|> once per context
  frame; <|audio_eos|> after each context utterance). Text positions embed with
  embed_text_tokens; the i-th <|AUDIO|> position embeds context frame i (the
  codec's codes, given here as audio_codes) as the sum over codebooks k of
  embed_audio_tokens[k * V + code_k]; <|audio_eos|> embeds the all-zero frame.
  As in transformers, audio positions keep their text embedding when no audio
  is given.
- Frame step: the backbone (Llama layers, llama3 RoPE, positions 0.. over the
  whole sequence) gives h, its last position's final-norm output; lm_head(h)
  scores codebook 0. The depth decoder then starts a fresh cache per frame:
  position 0 is h itself, position 1 embeds code 0, position k embeds code k-1
  with offset (k-1) * V in its own table; every input goes through
  inputs_embeds_projector; codebooks_head[k-1] at position k scores codebook k.
  The frame's summed embedding is the backbone's next input.
- Stop: after a frame whose codebooks 0..K-2 all equal codebook_eos_token_id (0;
  the last codebook is not looked at), which is kept as the last returned
  frame, or after max_new_frames frames.
- Sampling (per level): scores / temperature, then top-k (others -inf), then
  softmax and torch.multinomial; greedy is argmax of the raw scores.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F


def _rope_parameters(config: dict) -> dict:
    """rope_parameters (transformers 5), or rope_theta + rope_scaling as csm-1b's own config.json has them."""
    if config.get("rope_parameters"):
        return config["rope_parameters"]
    scaling = dict(config.get("rope_scaling") or {})
    scaling.setdefault("rope_type", scaling.pop("type", "default"))
    return {**scaling, "rope_theta": config.get("rope_theta", 10000.0)}


def _llama3_inv_freq(rope: dict, head_dim: int) -> torch.Tensor:
    """The inverse frequencies of transformers' llama3 RoPE (long wavelengths divided by `factor`, a smooth band between)."""
    base = rope["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.get("rope_type", "default") == "default":
        return inv_freq
    if rope["rope_type"] != "llama3":
        raise ValueError(f"unsupported rope_type {rope['rope_type']!r}")
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old_len = rope["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # In float32 whatever the weights' dtype, as CsmRMSNorm does.
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class _Llama:
    """One stack of CSM decoder layers (pre-norm attention + SwiGLU) with a key/value cache of its own."""

    def __init__(self, weights: dict, prefix: str, config: dict, dtype: torch.dtype):
        self.w = weights
        self.prefix = prefix
        self.layers = config["num_hidden_layers"]
        self.heads = config["num_attention_heads"]
        self.kv_heads = config["num_key_value_heads"]
        self.head_dim = config.get("head_dim") or config["hidden_size"] // self.heads
        self.eps = config["rms_norm_eps"]
        self.dtype = dtype
        self.inv_freq = _llama3_inv_freq(_rope_parameters(config), self.head_dim)
        self.reset()

    def reset(self) -> None:
        self.cache: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * self.layers
        self.length = 0

    def _rope(self, positions: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None].to(device) * self.inv_freq.to(device)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden] at positions length..length+T-1 -> final-norm outputs [T, hidden]."""
        w, p = self.w, self.prefix
        T = x.shape[0]
        if T > 1 and self.length > 0:
            raise ValueError("multi-position chunks only at the start of a sequence")
        positions = torch.arange(self.length, self.length + T)
        cos, sin = self._rope(positions, x.device)
        for i in range(self.layers):
            lp = f"{p}.layers.{i}"
            h = _rms_norm(x, w[f"{lp}.input_layernorm.weight"], self.eps)
            q = F.linear(h, w[f"{lp}.self_attn.q_proj.weight"]).view(T, self.heads, self.head_dim).transpose(0, 1)
            k = F.linear(h, w[f"{lp}.self_attn.k_proj.weight"]).view(T, self.kv_heads, self.head_dim).transpose(0, 1)
            v = F.linear(h, w[f"{lp}.self_attn.v_proj.weight"]).view(T, self.kv_heads, self.head_dim).transpose(0, 1)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            if self.cache[i] is not None:
                k = torch.cat((self.cache[i][0], k), dim=1)
                v = torch.cat((self.cache[i][1], v), dim=1)
            self.cache[i] = (k, v)
            groups = self.heads // self.kv_heads
            k = k.repeat_interleave(groups, dim=0)
            v = v.repeat_interleave(groups, dim=0)
            # Causal over a prompt; one new position sees every cached one.
            attn = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=T > 1, scale=self.head_dim**-0.5)
            x = x + F.linear(attn[0].transpose(0, 1).reshape(T, -1), w[f"{lp}.self_attn.o_proj.weight"])
            h = _rms_norm(x, w[f"{lp}.post_attention_layernorm.weight"], self.eps)
            gate = F.silu(F.linear(h, w[f"{lp}.mlp.gate_proj.weight"]))
            x = x + F.linear(gate * F.linear(h, w[f"{lp}.mlp.up_proj.weight"]), w[f"{lp}.mlp.down_proj.weight"])
        self.length += T
        return _rms_norm(x, w[f"{p}.norm.weight"], self.eps)


def _pick(logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int | None, generator: torch.Generator | None) -> int:
    """One id from float32 logits [V]: argmax, or transformers' temperature -> top-k -> softmax -> multinomial."""
    if not do_sample:
        return int(torch.argmax(logits))
    scores = logits[None] / temperature
    if top_k:
        kth = torch.topk(scores, min(top_k, scores.shape[-1]))[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, -float("inf"))
    probs = F.softmax(scores, dim=-1)
    return int(torch.multinomial(probs, num_samples=1, generator=generator)[0, 0])


class CsmReference:
    """A directory's weights, loaded once; generate() runs one prompt."""

    def __init__(self, model_dir: Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        from safetensors.torch import load_file

        model_dir = Path(model_dir)
        self.config = json.loads((model_dir / "config.json").read_text())
        generation = model_dir / "generation_config.json"
        self.generation = json.loads(generation.read_text()) if generation.exists() else {}
        weights = {}
        for path in sorted(model_dir.glob("*.safetensors")):
            for name, tensor in load_file(str(path), device=str(device)).items():
                if not name.startswith("codec_model."):
                    weights[name] = tensor.to(dtype)
        # Both codebook tables are stored by transformers; fall back on either if a writer dedupes them.
        backbone_table, depth_table = "backbone_model.embed_tokens.embed_audio_tokens.weight", "depth_decoder.model.embed_tokens.weight"
        weights.setdefault(depth_table, weights.get(backbone_table))
        weights.setdefault(backbone_table, weights.get(depth_table))
        self.w = weights
        self.dtype = dtype
        self.device = torch.device(device)
        c = self.config
        self.K = c["num_codebooks"]
        self.V = c["vocab_size"]
        self.offsets = torch.arange(self.K, device=self.device) * self.V
        self.backbone = _Llama(weights, "backbone_model", c, dtype)
        self.depth = _Llama(weights, "depth_decoder.model", c["depth_decoder_config"], dtype)

    def _frame_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [N, K] -> [N, hidden]: the sum of the codebooks' rows (CsmBackboneModelEmbeddings)."""
        return self.w["backbone_model.embed_tokens.embed_audio_tokens.weight"][codes + self.offsets].sum(dim=1)

    def prompt_embeddings(self, input_ids: torch.Tensor, audio_codes: torch.Tensor | list[torch.Tensor] | None) -> torch.Tensor:
        c = self.config
        ids = input_ids.reshape(-1).to(self.device)
        x = self.w["embed_text_tokens.weight"][ids]
        if audio_codes is None or (isinstance(audio_codes, list) and not audio_codes):
            return x
        codes = torch.cat(list(audio_codes)) if isinstance(audio_codes, list) else audio_codes
        codes = codes.to(self.device).long()
        audio = ids == c["audio_token_id"]
        if int(audio.sum()) != codes.shape[0]:
            raise ValueError(f"{int(audio.sum())} <|AUDIO|> positions but {codes.shape[0]} audio frames")
        x = x.clone()
        x[audio] = self._frame_embedding(codes)
        eos_frame = torch.full((1, self.K), c["codebook_eos_token_id"], device=self.device)
        x[ids == c["audio_eos_token_id"]] = self._frame_embedding(eos_frame)
        return x

    def _depth_frame(self, h: torch.Tensor, code0: int, sample: tuple, generator: torch.Generator | None) -> list[int]:
        """Codebooks 1..K-1 of one frame from the backbone output h [hidden] and codebook 0."""
        w, V = self.w, self.V
        table = w["depth_decoder.model.embed_tokens.weight"]
        project = w["depth_decoder.model.inputs_embeds_projector.weight"]
        heads = w["depth_decoder.codebooks_head.weight"]  # [K-1, hidden, V]
        self.depth.reset()
        x = torch.stack((h, table[code0]))  # position 0: h itself; position 1: code 0 (offset 0)
        codes = [code0]
        for k in range(1, self.K):
            out = self.depth(F.linear(x, project))[-1]
            logits = (out @ heads[k - 1]).float()
            codes.append(_pick(logits, *sample, generator))
            x = table[codes[-1] + k * V][None]  # fed at position k + 1 with codebook k's offset
        return codes

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_frames: int,
        audio_codes: torch.Tensor | list[torch.Tensor] | None = None,
        *,
        do_sample: bool = False,
        temperature: float | None = None,
        top_k: int | None = None,
        depth_decoder_do_sample: bool | None = None,
        depth_decoder_temperature: float | None = None,
        depth_decoder_top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Codes [frames, K] for one prompt. Sampling settings left None come from generation_config.json
        (csm-1b: 0.9 and top-k 50 at both levels); the depth decoder samples when the backbone does unless told.
        `generator` None draws from torch's global generator, as transformers' generate does."""
        g = self.generation
        backbone_sample = (
            do_sample,
            g.get("temperature", 1.0) if temperature is None else temperature,
            g.get("top_k") if top_k is None else top_k,
        )
        depth_sample = (
            do_sample if depth_decoder_do_sample is None else depth_decoder_do_sample,
            g.get("depth_decoder_temperature", 1.0) if depth_decoder_temperature is None else depth_decoder_temperature,
            g.get("depth_decoder_top_k") if depth_decoder_top_k is None else depth_decoder_top_k,
        )
        eos = self.config["codebook_eos_token_id"]
        self.backbone.reset()
        x = self.prompt_embeddings(input_ids, audio_codes)
        frames = []
        while len(frames) < max_new_frames:
            h = self.backbone(x)[-1]
            logits = F.linear(h, self.w["lm_head.weight"]).float()
            code0 = _pick(logits, *backbone_sample, generator)
            frame = torch.tensor(self._depth_frame(h, code0, depth_sample, generator), device=self.device)
            frames.append(frame)
            if bool((frame[:-1] == eos).all()):
                break
            x = self._frame_embedding(frame[None])
        return torch.stack(frames) if frames else torch.zeros((0, self.K), dtype=torch.long, device=self.device)


def generate_codes(
    model_dir: Path,
    input_ids: torch.Tensor,
    max_new_frames: int,
    audio_codes: torch.Tensor | list[torch.Tensor] | None = None,
    **sampling,
) -> torch.Tensor:
    """CsmReference(model_dir).generate(...): codes [frames, K] (greedy unless do_sample=True)."""
    return CsmReference(model_dir).generate(input_ids, max_new_frames, audio_codes, **sampling)
