"""Qwen3-Omni's talker (transformers' Qwen3OmniMoeTalkerForConditionalGeneration inside
Qwen3OmniMoeForConditionalGeneration) for the worker's step machinery, as Sesame CSM's
backbone and depth decoder are run (models/csm): the talker's decoder over the paged KV
cache, batched across requests, and the code predictor run for every row that sampled in a
step at once. What the thinker gives the talker is turned into its rows by pure functions.

    talker = load_talker(model_dir)                                  # or Qwen3OmniTalker(reader, config)
    rows, ids = talker_prompt(talker, prompt_ids, embeds, mm_hidden, "ethan")  # [Q, H], [Q]
    positions = talker_positions(ids, image_grid_thw, talker.ids)    # None: sequential
    hidden = talker.hidden_states(ids, positions, attention, replace=(arange(Q), rows))
    h = talker.head_input(hidden, last)                              # [R, H]: final-norm rows
    c0 = sample(rules.apply(talker.codebook0_logits(h), histories))  # TalkerLogitsRules
    codes, codec = talker.code_predictor.frames(h, c0, sample)       # [R, G], [R, H]
    text = talker.text_rows(token_ids, thinker_embeds)               # trailing_text_id says which
    next_rows = codec + text                                         # the rows' next inputs

Decoder. talker_config.text_config is a Qwen3-MoE decoder (q/k RMSNorm; every layer routes
to num_experts experts, top num_experts_per_tok, and adds a shared expert scaled by a sigmoid
gate: transformers' talker layer replaces whatever MLP mlp_only_layers would give with that
block, so every layer is sparse here too), model/decoder.py's DecoderModel over the weights
talker.model.* with talker.model.codec_embedding as its embedding table, no vocabulary head of
its own: codec_head (talker.codec_head) scores the codec vocabulary (codebook 0 of a frame,
the codec's specials, codec_eos) from the final-norm rows. Every input row is a sum of
projections and embeddings, so every position comes in through the decoder's `replace` path.

Rotary positions are M-RoPE with interleaved sections. transformers gives the talker the plain
running position on all three streams (ordinary RoPE) unless the request has image or video
grids: a text prompt, and an audio one too (its get_rope_index builds 3-D positions only when a
grid is given). With images, the talker's own ids (talker_prompt's) get (t, h, w) over each
image's merged grid from the running position, which then resumes past the grid's larger side
(talker_positions, Qwen2.5-VL's rope_positions: the same numbers for one-frame images); later
positions are the last prompt position + 1, + 2, ... on every stream, which is the offset the
StepRunner gives a prompt that comes with positions. Videos are not covered.

Code predictor (talker.code_predictor.*): a small Qwen3 decoder that fills a frame's residual
groups 1..G-1 from the talker's final-norm row h (what transformers' prepare_inputs_for_generation
takes as hidden_states[0][-1][:, -1:]: the last element of the hidden_states tuple is
last_hidden_state, after the norm) and codebook 0: position 0 is h, position 1 the talker's
codec_embedding(c0), position k + 1 group k's embedding (its own table codec_embedding[k - 1]);
lm_head[k - 1] at position k scores group k. It starts empty for every frame (csm's
FrameAttention, one forward per group for all rows). The talker's next input row is the sum,
in this order, of codec_embedding(c0) and the code predictor's embeddings of groups 1..G-1,
plus the step's text row.

Text. Every text row is text_projection (a SiLU MLP from the thinker's width) of a thinker
input-embedding row; a multimodal position (audio, image, video tokens) of a user turn takes
hidden_projection of the thinker's hidden state there at accept_hidden_layer instead. See
talker_prompt for the prompt and trailing_text_id for the row each decode step adds.

Logits. transformers' generate applies repetition_penalty (1.05 by default) over the talker's
generated codebook-0 ids (generate gets inputs_embeds only, so no prompt ids count) and then
suppresses the last 1024 ids of the codec vocabulary except codec_eos, greedy or not
(TalkerLogitsRules); sampling then uses temperature 0.9 and top-k 50 (TALKER_SAMPLING). The
code predictor's generation config is empty: greedy is a plain argmax; sampling (mirrored
from the talker's do_sample) uses top-k 50 and top-p 0.8 at temperature 1 (CODE_PREDICTOR_SAMPLING).
The talker stops when codebook 0 is codec_eos; that step's frame is never made, nor is the
frame of the codebook 0 drawn at talker_max_new_tokens (transformers builds a frame only for
the next step's input).

Arithmetic follows transformers' order (float32 RMSNorm and router, the experts added in
ascending order then the gated shared expert, the codec sum in group order, the text row
added last), so greedy codes equal Qwen3OmniMoeForConditionalGeneration.generate's in
float32; attention through the paged backend sums in another order than SDPA, so hidden
states agree to rounding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...model.config import ConfigError, ModelConfig, _moe_config, read_json, stack_config
from ...model.decoder import DecoderModel
from ...model.weights import WeightReader
from ..csm.model import FrameAttention, Reader, Sample, _Stack, greedy
from ..qwen2_5_vl.graph_model import rope_positions

ARCHITECTURE = "Qwen3OmniMoeForConditionalGeneration"
CODEC_TABLE = "talker.model.codec_embedding.weight"
THINKER_TABLE = "thinker.model.embed_tokens.weight"
# generate's thinker_eos_token_id default: what its trailing text rows treat as the end of the text.
THINKER_EOS = (151645,)
# The sampling settings transformers' generate uses when sampling (talker_* arguments; the code
# predictor's are fixed in prepare_inputs_for_generation, its temperature is GenerationConfig's 1.0).
TALKER_SAMPLING = {"temperature": 0.9, "top_k": 50, "top_p": 1.0}
CODE_PREDICTOR_SAMPLING = {"temperature": 1.0, "top_k": 50, "top_p": 0.8}
REPETITION_PENALTY = 1.05
SUPPRESSED_TAIL = 1024  # the codec vocabulary's last ids, suppressed but for codec_eos


@dataclass(frozen=True)
class TalkerIds:
    """The ids and sizes the talker's inputs are built from (config.json; transformers' defaults where absent)."""

    codec_vocab: int
    num_code_groups: int
    accept_hidden_layer: int
    codec_eos: int
    codec_pad: int
    codec_bos: int
    codec_nothink: int
    codec_think_bos: int
    codec_think_eos: int
    speakers: dict[str, int]
    tts_pad: int
    tts_bos: int
    tts_eos: int
    im_start: int
    user: int
    assistant: int
    multimodal: tuple[int, ...]  # the thinker's audio, image and video token ids (which positions take hidden rows)
    image_token: int  # the talker's (its get_rope_index's)
    spatial_merge_size: int

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> TalkerIds:
        talker, thinker = _section(config, "talker_config"), config.get("thinker_config") or {}
        text = _section(talker, "text_config", "talker_config")
        mm = {k: int(thinker.get(k, talker.get(k, d)))
              for k, d in (("audio_token_id", 151646), ("image_token_id", 151655), ("video_token_id", 151656))}
        return cls(
            codec_vocab=int(text["vocab_size"]),
            num_code_groups=int(talker.get("num_code_groups", 32)),
            accept_hidden_layer=int(talker.get("accept_hidden_layer", 18)),
            codec_eos=int(talker.get("codec_eos_token_id", 4198)),
            codec_pad=int(talker.get("codec_pad_id", 4196)),
            codec_bos=int(talker.get("codec_bos_id", 4197)),
            codec_nothink=int(talker.get("codec_nothink_id", 4203)),
            codec_think_bos=int(talker.get("codec_think_bos_id", 4204)),
            codec_think_eos=int(talker.get("codec_think_eos_id", 4205)),
            speakers={str(k).lower(): int(v) for k, v in (talker.get("speaker_id") or {}).items()},
            tts_pad=int(config.get("tts_pad_token_id", 151671)),
            tts_bos=int(config.get("tts_bos_token_id", 151672)),
            tts_eos=int(config.get("tts_eos_token_id", 151673)),
            im_start=int(config.get("im_start_token_id", 151644)),
            user=int(config.get("user_token_id", 872)),
            assistant=int(config.get("assistant_token_id", 77091)),
            multimodal=tuple(mm.values()),
            image_token=int(talker.get("image_token_id", mm["image_token_id"])),
            spatial_merge_size=int(talker.get("spatial_merge_size", 2)),
        )

    def speaker_id(self, speaker: str | int) -> int:
        """A speaker's codec id: by name, any case (generate lowercases it), or the id itself."""
        if isinstance(speaker, int):
            return speaker
        found = self.speakers.get(speaker.lower())
        if found is None:
            raise ValueError(f"unknown speaker {speaker!r}; this model has {', '.join(sorted(self.speakers)) or 'none'}")
        return found


def _section(raw: dict[str, Any], key: str, where: str = "config.json") -> dict[str, Any]:
    value = raw.get(key)
    if not isinstance(value, dict):
        raise ConfigError(f"{where} has no {key} object")
    return value


def _stack_config(raw: dict[str, Any], what: str) -> ModelConfig:
    """One of the talker's Qwen3-style stacks (q/k norms, no biases but attention_bias)."""
    return stack_config(raw, what, ARCHITECTURE, qk_norm=True, rms_norm_eps=1e-6, max_positions=32768)


def talker_config(config: dict[str, Any]) -> ModelConfig:
    """The talker decoder's shape (talker_config.text_config): what sizes its KV cache. vocab_size is the
    codec vocabulary (codec_head's rows); eos is codec_eos."""
    talker = _section(config, "talker_config")
    text = _section(talker, "text_config", "talker_config")
    what = "talker_config.text_config"
    base = _stack_config(text, what)
    moe = _moe_config(text, Path(what), base.num_layers)
    if moe is None:
        raise ConfigError(f"{what}: the talker's layers are mixtures of experts; num_experts is 0")
    if not moe.shared_intermediate_size:
        raise ConfigError(f"{what}: the talker's layers have a shared expert; shared_expert_intermediate_size is 0")
    # Qwen3OmniMoeTalkerDecoderLayer puts the sparse block in every layer, mlp_only_layers or not.
    moe = dataclasses.replace(moe, sparse_layers=(True,) * base.num_layers)
    eos = int(talker.get("codec_eos_token_id", 4198))
    return dataclasses.replace(base, moe=moe, eos_token_ids=[eos])


def code_predictor_config(config: dict[str, Any]) -> ModelConfig:
    """The code predictor's shape (talker_config.code_predictor_config); vocab_size is one group's codebook."""
    talker = _section(config, "talker_config")
    raw = _section(talker, "code_predictor_config", "talker_config")
    c = _stack_config(raw, "talker_config.code_predictor_config")
    groups = int(talker.get("num_code_groups", raw.get("num_code_groups", 32)))
    # A frame has `groups` positions: only a window shorter than that would change anything.
    window, first = raw.get("sliding_window"), int(raw.get("max_window_layers", 28))
    kinds = raw.get("layer_types") or ["sliding_attention" if window is not None and i >= first else "full_attention"
                                       for i in range(c.num_layers)]
    if window is not None and int(window) < groups and "sliding_attention" in kinds:
        raise ConfigError(f"code predictor: a sliding window of {window} over a frame's {groups} positions is not supported")
    return c


def read_config(model_dir: Path) -> ModelConfig:
    """The talker decoder's shape with the THINKER's vocabulary, as the engine sees the talker node: its
    prompt ids are talker_prompt's (thinker ids of the user turns, then tts_pad), its sampled ids codec ids
    (fewer than the thinker's), so both lie inside."""
    raw = read_json(Path(model_dir) / "config.json")
    config = talker_config(raw)
    thinker = _section(_section(raw, "thinker_config"), "text_config", "thinker_config")
    return dataclasses.replace(config, vocab_size=max(config.vocab_size, int(thinker["vocab_size"])))


class ResizeMLP:
    """Qwen3OmniMoeTalkerResizeMLP: linear_fc2(SiLU(linear_fc1(x))), both with biases (thinker width -> talker width)."""

    def __init__(self, reader: Reader, prefix: str):
        self.fc1_weight, self.fc1_bias = reader.get(prefix + "linear_fc1.weight"), reader.get(prefix + "linear_fc1.bias")
        self.fc2_weight, self.fc2_bias = reader.get(prefix + "linear_fc2.weight"), reader.get(prefix + "linear_fc2.bias")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.silu(F.linear(x, self.fc1_weight, self.fc1_bias)), self.fc2_weight, self.fc2_bias)

    def tensors(self) -> list[torch.Tensor]:
        return [self.fc1_weight, self.fc1_bias, self.fc2_weight, self.fc2_bias]


class CodePredictor:
    """A frame's residual groups 1..G-1 from the talker's h and codebook 0, for many rows at once, and the
    codec part of the rows' next talker inputs.

    codec_table: the talker's codec_embedding (position 1 embeds codebook 0 with it)."""

    def __init__(self, reader: Reader, config: dict[str, Any], codec_table: torch.Tensor, fuse: bool = True):
        self.config = c = code_predictor_config(config)
        self.num_code_groups = int(config["talker_config"].get("num_code_groups", 32))
        self.device, self.dtype = reader.device, reader.dtype
        if codec_table.shape[1] != c.hidden_size:
            raise ConfigError(f"code predictor hidden {c.hidden_size} != talker hidden {codec_table.shape[1]}: "
                              "the talker's rows go in as they are")
        self.codec_table = codec_table
        # Its inputs are given rows, so the decoder's own table is a placeholder row.
        placeholder = torch.zeros(1, c.hidden_size, dtype=self.dtype, device=self.device)
        self.decoder = DecoderModel(c, _Stack(reader, "talker.code_predictor.model.", placeholder), fuse=fuse, head=False)
        groups = range(self.num_code_groups - 1)
        self.tables = [reader.get(f"talker.code_predictor.model.codec_embedding.{k}.weight") for k in groups]
        self.heads = [reader.get(f"talker.code_predictor.lm_head.{k}.weight") for k in groups]

    def weight_bytes(self) -> int:
        return self.decoder.weight_bytes() + sum(t.numel() * t.element_size() for t in (*self.tables, *self.heads))

    def attention(self, rows: int) -> FrameAttention:
        """A fresh frame cache for `rows` rows (positions 0..G-1)."""
        c = self.config
        return FrameAttention(c.num_layers, rows, self.num_code_groups, c.num_heads, c.num_kv_heads, c.head_dim,
                              self.decoder.scale, self.dtype, self.device)

    @torch.inference_mode()
    def frames(self, h: torch.Tensor, c0: torch.Tensor, sample: Sample = greedy) -> tuple[torch.Tensor, torch.Tensor]:
        """h [R, hidden] (final-norm talker rows), codebook 0 [R] -> (the frames [R, G], column 0 c0; the codec
        part of each row's next talker input [R, hidden]: codec_embedding(c0) plus groups 1..G-1's embeddings,
        summed in that order as transformers sums them). One forward per group for all R rows;
        sample(float32 logits [R, codebook], k) picks group k."""
        r, G, device = h.shape[0], self.num_code_groups, self.device
        c0 = c0.to(device=device, dtype=torch.int64).reshape(r)
        codes = torch.empty(r, G, dtype=torch.int64, device=device)
        codes[:, 0] = c0
        first = F.embedding(c0, self.codec_table)
        embeds = [first]
        if r and G > 1:
            attention = self.attention(r)
            # Position 0: h; position 1: codebook 0. Rows' positions contiguous in the flat batch.
            x = torch.stack((h.to(self.dtype), first), dim=1).reshape(2 * r, -1)
            positions = torch.arange(2, device=device).repeat(r)
            last = torch.arange(1, 2 * r, 2, device=device)
            dummy = torch.zeros(2 * r, dtype=torch.int64, device=device)
            for k in range(1, G):
                n = x.shape[0]
                hidden = self.decoder.hidden_states(dummy[:n], positions, attention.advance(n // r),
                                                    replace=(torch.arange(n, device=device), x))
                logits = F.linear(self.decoder.head_input(hidden, last), self.heads[k - 1]).float()
                codes[:, k] = sample(logits, k).to(device=device, dtype=torch.int64).reshape(r)
                x = F.embedding(codes[:, k], self.tables[k - 1])  # group k: position k + 1, and the sum
                embeds.append(x)
                positions = torch.full((r,), k + 1, dtype=torch.int64, device=device)
                last = torch.arange(r, device=device)
        return codes, torch.stack(embeds, dim=1).sum(dim=1)


class Qwen3OmniTalker:
    """The talker for the StepRunner: DecoderModel's step interface over the talker's decoder (hidden_states
    over the paged cache, head_input, logits; config, scale, tp, rotary as a decoder has them), the codec
    head (codebook0_logits, as CsmStepModel names it), the projections and the code predictor.

    reader: stored names (a WeightReader over the whole directory); config: config.json's dict;
    model_config: the loader's view of the decoder (read_config's), else talker_config's."""

    def __init__(self, reader: Reader, config: dict[str, Any], model_config: ModelConfig | None = None, fuse: bool = True):
        self.ids = TalkerIds.from_config(config)
        decoder_config = talker_config(config)
        self.config = model_config or decoder_config
        self.device, self.dtype = reader.device, reader.dtype
        self.decoder = DecoderModel(decoder_config, _Stack(reader, "talker.model.", CODEC_TABLE), fuse=fuse, head=False)
        self.codec_table = self.decoder.embed
        self.codec_head = reader.get("talker.codec_head.weight")
        self.text_projection = ResizeMLP(reader, "talker.text_projection.")
        self.hidden_projection = ResizeMLP(reader, "talker.hidden_projection.")
        self.code_predictor = CodePredictor(reader, config, self.codec_table, fuse=fuse)
        # generate projects <tts_text_bos>, <tts_text_eod>, <tts_pad> in one call and reuses the rows: the prompt
        # and every later step take these bits. Only their three thinker embedding rows are kept.
        ids = self.ids
        specials = reader.get(THINKER_TABLE)[[ids.tts_bos, ids.tts_eos, ids.tts_pad]]
        self.tts_rows = self.text_projection(specials[None])[0]  # [3, hidden]: bos, eos, pad
        self.scale = self.decoder.scale
        self.rotary = self.decoder.rotary
        self.tp = None
        self.num_code_groups = self.code_predictor.num_code_groups
        self.eos = ids.codec_eos
        if self.codec_head.shape != (decoder_config.vocab_size, decoder_config.hidden_size):
            raise ConfigError(f"codec_head {tuple(self.codec_head.shape)} is not codec vocabulary x hidden_size")

    def weight_bytes(self) -> int:
        tensors = [self.codec_head, self.tts_rows, *self.text_projection.tensors(), *self.hidden_projection.tensors()]
        return self.decoder.weight_bytes() + self.code_predictor.weight_bytes() + sum(t.numel() * t.element_size() for t in tensors)

    @torch.inference_mode()
    def hidden_states(self, input_ids, positions, attention, replace=None, lora=None) -> torch.Tensor:
        """The residual stream after the last layer (before the final norm) for the step's new positions
        ([T], or [3, T] multimodal positions). Every talker row is given in `replace`; ids outside the codec
        vocabulary (a prompt's thinker ids) embed a placeholder row that the replacement overwrites."""
        ids = input_ids.masked_fill((input_ids < 0) | (input_ids >= self.decoder.embed.shape[0]), 0)
        return self.decoder.hidden_states(ids, positions, attention, replace=replace)

    @torch.inference_mode()
    def head_input(self, hidden: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """The rows at `indices` through the final norm: h, what codec_head scores and the code predictor starts from."""
        return self.decoder.head_input(hidden, indices.to(self.device))

    @torch.inference_mode()
    def codebook0_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final-norm rows h [R, hidden] -> float32 codec logits [R, codec vocabulary] (codec_head)."""
        return F.linear(h, self.codec_head).float()

    def logits(self, hidden: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        return self.codebook0_logits(self.head_input(hidden, indices))

    @torch.inference_mode()
    def text_rows(self, token_ids: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """Decode steps' text rows [R, hidden]: text_projection of the thinker embedding rows embeds [R, thinker
        hidden], one call; where token_ids [R] (trailing_text_id's) is <tts_text_eod> or <tts_pad>, the rows
        generate reuses (tts_rows; those rows of `embeds` are ignored)."""
        ids = token_ids.to(self.device).reshape(-1, 1)
        out = self.text_projection(embeds.to(device=self.device, dtype=self.dtype))
        out = torch.where(ids == self.ids.tts_eos, self.tts_rows[1], out)
        return torch.where(ids == self.ids.tts_pad, self.tts_rows[2], out)


def make_step_model(model_dir: Path):
    """KvDecoderLayout.make_decoder for a Qwen3-Omni directory's talker (its reader over stored names)."""
    raw = read_json(Path(model_dir) / "config.json")
    return lambda config, reader: Qwen3OmniTalker(reader, raw, config)


def load_talker(model_dir: Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                fuse: bool = True) -> Qwen3OmniTalker:
    model_dir = Path(model_dir)
    reader = WeightReader(model_dir, dtype, torch.device(device))
    try:
        return Qwen3OmniTalker(reader, read_json(model_dir / "config.json"), fuse=fuse)
    finally:
        reader.close()


# --- what the thinker gives the talker ---


def assistant_start(prompt_ids: Sequence[int] | np.ndarray | torch.Tensor, ids: TalkerIds) -> int:
    """The index of the prompt's last <|im_start|> followed by `assistant`: where generate's assistant part starts."""
    p = np.asarray(torch.as_tensor(prompt_ids).cpu(), dtype=np.int64).reshape(-1)
    starts = np.flatnonzero((p[:-1] == ids.im_start) & (p[1:] == ids.assistant))
    if not len(starts):
        raise ValueError("the prompt has no <|im_start|>assistant turn for the talker to speak")
    return int(starts[-1])


def user_positions(prompt_ids: np.ndarray, ids: TalkerIds) -> np.ndarray:
    """The prompt positions generate gives the talker before the assistant part: every position whose
    latest <|im_start|> (itself included) is followed by `user` (each user turn from its <|im_start|> to
    the next one's; system and earlier assistant turns are left out). Positions before the first
    <|im_start|> go by prompt_ids[1], as transformers' clamped index makes them."""
    p = len(prompt_ids)
    at = np.where(prompt_ids == ids.im_start, np.arange(p), -1)
    previous = np.maximum.accumulate(at).clip(min=0)
    roles = prompt_ids[np.minimum(previous + 1, p - 1)]
    return np.flatnonzero(roles == ids.user)


@torch.inference_mode()
def talker_prompt(talker: Qwen3OmniTalker, prompt_ids: torch.Tensor, embeds: torch.Tensor, mm_hidden: torch.Tensor | None,
                  speaker: str | int) -> tuple[torch.Tensor, torch.Tensor]:
    """The talker's prompt rows [Q, hidden] and ids [Q] (generate's talker_input_embed and talker_input_id).

    prompt_ids [P]: the thinker's prompt; embeds [>= max(P, a + 4), thinker hidden]: the thinker's input
    embedding rows of the prompt and, after it, of its first generated token (a: assistant_start; the
    prompt normally ends with the assistant header a, a + 1, a + 2, so row a + 3 = P is the first generated
    token's), rows at multimodal positions ignored; mm_hidden [M, thinker hidden]: the thinker's hidden
    states at layer accept_hidden_layer (transformers' hidden_states[accept_hidden_layer]: the output of
    decoder layer accept_hidden_layer - 1, before any deepstack features are added there) at the prompt's
    M audio / image / video positions, in order (None: none); speaker: a name or codec id.

    Rows: the user turns' positions (user_positions), each text position text_projection(embed) and each
    multimodal one hidden_projection(hidden), with their thinker ids; then nine assistant rows with id
    <tts_pad>: text_projection of rows a, a + 1, a + 2; <tts_pad> + codec_nothink, <tts_pad> + think_bos,
    <tts_pad> + think_eos, <tts_pad> + the speaker, <tts_text_bos> + codec_pad, and text_projection of row
    a + 3 (the first text token) + codec_bos (codec rows: the talker's codec_embedding). The thinker's
    tokens after a + 3 come one per decode step (trailing_text_id).

    Projections run one call per kind over the rows needed, as generate's calls over more rows give
    the same values (a matrix product's row does not depend on the other rows of a call here, except
    that one row alone may take another kernel: rounding)."""
    ids = talker.ids
    tokens = np.asarray(prompt_ids.cpu(), dtype=np.int64).reshape(-1)
    p = len(tokens)
    a = assistant_start(tokens, ids)
    if embeds.shape[0] < max(p, a + 4):
        raise ValueError(f"embeds has {embeds.shape[0]} rows; the prompt of {p} needs {max(p, a + 4)} (its first text token's too)")
    device, dtype = talker.device, talker.dtype
    embeds = embeds.to(device=device, dtype=dtype)
    multimodal = np.isin(tokens, ids.multimodal)
    count = int(multimodal.sum())
    if count and (mm_hidden is None or mm_hidden.shape[0] != count):
        raise ValueError(f"the prompt has {count} multimodal positions but {0 if mm_hidden is None else mm_hidden.shape[0]} hidden rows")
    user = user_positions(tokens, ids)
    rows = torch.empty(len(user), talker.config.hidden_size, dtype=dtype, device=device)
    is_mm = multimodal[user]
    if is_mm.any():
        rank = np.cumsum(multimodal) - 1  # a multimodal position's row in mm_hidden
        hidden = mm_hidden.to(device=device, dtype=dtype)[torch.from_numpy(rank[user[is_mm]]).to(device)]
        rows[torch.from_numpy(np.flatnonzero(is_mm)).to(device)] = talker.hidden_projection(hidden)
    if (~is_mm).any():
        text = embeds[torch.from_numpy(user[~is_mm]).to(device)]
        rows[torch.from_numpy(np.flatnonzero(~is_mm)).to(device)] = talker.text_projection(text)

    assistant = talker.text_projection(embeds[a : a + 4])
    bos, _, pad = talker.tts_rows
    text_part = torch.cat((assistant[:3], pad.expand(4, -1), bos[None], assistant[3:4]))
    codec_ids = [ids.codec_nothink, ids.codec_think_bos, ids.codec_think_eos, ids.speaker_id(speaker), ids.codec_pad, ids.codec_bos]
    codec = F.embedding(torch.tensor(codec_ids, device=device), talker.codec_table)
    codec_part = torch.cat((torch.zeros(3, codec.shape[1], dtype=dtype, device=device), codec))
    prompt_rows = torch.cat((rows, text_part + codec_part))
    prompt_ids_out = torch.cat((torch.from_numpy(tokens[user]), torch.full((9,), ids.tts_pad, dtype=torch.int64)))
    return prompt_rows, prompt_ids_out


def talker_positions(talker_ids: torch.Tensor, image_grid_thw: torch.Tensor | None, ids: TalkerIds,
                     video: bool = False) -> torch.Tensor | None:
    """The talker prompt's rotary positions: None where transformers uses the running position on all three
    streams (no image: text and audio prompts alike), else int64 [3, Q] (t, h, w) as its get_rope_index gives
    them for images: each image's run of tokens takes its merged grid from the running position, which then
    resumes past the larger side. image_grid_thw [images, 3] must be the talker's images: those of the user
    turns (generate passes the request's, which are those unless a system turn has one). Decode step j's
    position is the last prompt position + 1 + j (max + 1 + j) on every stream.

    A prompt with audio and images gets the same: its audio tokens run on like text, as get_rope_index
    numbers them (one position per audio token between <|audio_start|> and <|audio_end|>); transformers
    itself fails on that prompt (the talker's config has no audio_config for the audio's length)."""
    if video:
        raise NotImplementedError("talker positions for videos (and audio in video) are not implemented")
    if image_grid_thw is None or image_grid_thw.numel() == 0:
        return None
    tokens = np.asarray(talker_ids.cpu(), dtype=np.int64).reshape(-1)
    grids = np.asarray(image_grid_thw.cpu(), dtype=np.int64).reshape(-1, 3)
    if (grids[:, 0] != 1).any():
        raise NotImplementedError("an image grid of several frames (its t positions would be scaled by position_id_per_seconds)")
    return torch.from_numpy(rope_positions(tokens, grids, ids.image_token, ids.spatial_merge_size))


def trailing_text_id(sequence: Sequence[int], prompt_len: int, step: int, finished: bool, ids: TalkerIds,
                     eos_ids: Sequence[int] = THINKER_EOS) -> int | None:
    """The thinker id whose projected embedding is the text row talker decode step `step` (0: the step that
    feeds the frame drawn after the prefill) adds to its codec sum; <tts_text_eod> / <tts_pad> mean
    talker.tts_rows (text_rows does that). None: not known yet.

    sequence: the thinker's tokens so far (prompt, then generated); prompt_len: P; finished: the thinker has
    stopped (sequence is final); eos_ids: generate's thinker_eos_token_id (<|im_end|> by default).

    As generate builds them (a = assistant_start; row a + 3, the first text token, is in the prompt):
    step j takes sequence[a + 4 + j], except that the sequence's LAST token is never embedded (generate's
    thinker hidden states stop before it): its step takes <tts_text_eod> instead, and every later step
    <tts_pad>. Then, where the first generated token in eos_ids is generated token e, step e takes
    <tts_text_eod> and later steps <tts_pad> (only inside the steps that had text; for a thinker that
    stops at its eos, e is the last token, so this changes nothing).

    What step j needs of the thinker, for a prompt that ends with the assistant header (a + 3 = P; g_i the
    i-th generated token): g_{j+1}, and whether it is the thinker's last token: known once g_{j+2} exists
    (then the row is g_{j+1}'s) or the thinker has finished (then g_{j+1}, if it was the last, gives
    <tts_text_eod>; a step past it <tts_pad>). The talker's prefill needs g_0 (talker_prompt's row a + 3).
    So the talker runs two thinker tokens behind, one at the end."""
    tokens = list(sequence)
    a = assistant_start(tokens[:prompt_len], ids)
    generated = tokens[prompt_len:]
    eos = next((i for i, t in enumerate(generated) if t in eos_ids), None)
    if eos is None and not finished and len(generated) <= step:
        return None  # an eos at or before `step` may still come
    at = a + 4 + step
    if at + 1 < len(tokens):
        value = tokens[at]
    elif not finished:
        return None
    elif at + 1 == len(tokens):
        value = ids.tts_eos
    else:
        return ids.tts_pad  # past the text rows: no masking there
    if eos is not None and step > eos:
        return ids.tts_pad
    if eos is not None and step == eos:
        return ids.tts_eos
    return value


# --- the talker's logits rules ---


class TalkerLogitsRules:
    """What generate applies to the talker's codec logits, greedy or sampled, in its order:
    RepetitionPenaltyLogitsProcessor over the row's generated ids (a score s of an id generated before
    becomes s * penalty where s < 0, else s / penalty), then SuppressTokensLogitsProcessor (the codec
    vocabulary's last SUPPRESSED_TAIL ids but codec_eos: -inf). The StepRunner's logits_rules interface."""

    def __init__(self, vocab_size: int, codec_eos: int, repetition_penalty: float = REPETITION_PENALTY):
        self.vocab_size = vocab_size
        self.penalty = float(repetition_penalty)
        suppressed = [i for i in range(max(vocab_size - SUPPRESSED_TAIL, 0), vocab_size) if i != codec_eos]
        self.suppressed = torch.tensor(suppressed, dtype=torch.int64)

    @classmethod
    def from_config(cls, config: dict[str, Any], repetition_penalty: float = REPETITION_PENALTY) -> TalkerLogitsRules:
        ids = TalkerIds.from_config(config)
        return cls(ids.codec_vocab, ids.codec_eos, repetition_penalty)

    @classmethod
    def from_dir(cls, model_dir: Path | str) -> TalkerLogitsRules:
        """KvDecoderLayout.logits_rules: generate's defaults (penalty 1.05)."""
        return cls.from_config(read_json(Path(model_dir) / "config.json"))

    def apply(self, logits: torch.Tensor, rows: list[tuple[Sequence[int], int]]) -> torch.Tensor:
        """logits: float32 [R, codec vocabulary]; rows[r]: (the row's token ids so far, prompt then generated;
        the prompt's length): only the generated ids are penalized. Returns a new tensor."""
        if logits.shape[0] != len(rows):
            raise ValueError(f"{logits.shape[0]} rows of logits but {len(rows)} token histories")
        if logits.shape[-1] != self.vocab_size:
            raise ValueError(f"logits have {logits.shape[-1]} ids; the rules were built for {self.vocab_size}")
        device = logits.device
        out = logits
        if self.penalty != 1.0:
            which, columns = [], []
            for r, (tokens, num_prompt) in enumerate(rows):
                generated = np.unique(np.asarray(tokens[num_prompt:], dtype=np.int64))
                generated = generated[(generated >= 0) & (generated < self.vocab_size)]  # others cannot be scored
                which.append(np.full(len(generated), r, dtype=np.int64))
                columns.append(generated)
            if sum(len(c) for c in columns):
                mask = torch.zeros(logits.shape, dtype=torch.bool, device=device)
                mask[torch.from_numpy(np.concatenate(which)).to(device), torch.from_numpy(np.concatenate(columns)).to(device)] = True
                penalized = torch.where(logits < 0, logits * self.penalty, logits / self.penalty)
                out = torch.where(mask, penalized, logits)
        return out.index_fill(1, self.suppressed.to(device), float("-inf"))
