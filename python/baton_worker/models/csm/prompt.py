"""A CSM speech request (text, speaker, earlier utterances) -> the backbone's prompt, built
as transformers builds it for CsmForConditionalGeneration, so the served model sees the
same input_ids and context codes:

    prompter = CsmPrompter(model_dir)                        # once per worker
    prompt = prompter.build("Hello.", "0", [ContextTurn("Hi there.", "1", wav_bytes)])
    prompt.input_ids                                         # np.int32 [T]
    prompt.frames                                            # torch.int64 [T, K+1] (model.prompt_frames)

Context turns are voice prompting: a reference clip and its transcript, spoken by a
speaker id. The conversation goes into CsmProcessor's chat form (every context turn
{"type": "text"} + {"type": "audio"}, then the turn to speak, text only) and through
apply_chat_template, which tokenizes `<|begin_of_text|>[speaker]text<|end_of_text|>` per
turn and one <|AUDIO|> per codec frame plus <|audio_eos|> after each clip. The clips are
decoded with Whisper's PyAV decoder (any supported container, mono float32 at the
processor's 24 kHz) and encoded by the checkpoint's own Mimi (transformers' MimiModel over
the `codec_model.*` weights, float32): one encode per utterance over the processor's
input_values cut at input_values_cutoffs, as CsmForConditionalGeneration does, so the
codes are the same. Only the codec is kept; the backbone and depth decoder are loaded
elsewhere.

Every rejected request raises ValueError (whisper.audio.AudioError for the audio) whose
message starts with the request field at fault ("input", "voice", or the turn's field).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from safetensors import safe_open

from ...model.config import ConfigError, read_json
from ...model.weights import weight_files
from ..whisper.audio import AudioError, decode_audio
from .mimi import CODEC_PREFIX
from .model import prompt_frames

MAX_CONTEXT_SECONDS = 60.0
# Speaker ids as csm-1b's template takes them, in one spelling only: "07" or a non-ASCII
# digit (which str.isdigit, the template's check, accepts) would tokenize differently from "7".
_SPEAKER = re.compile(r"0|[1-9][0-9]{0,8}")


class ContextTurn(NamedTuple):
    """An earlier utterance: its transcript, its speaker id and its audio (a file's bytes: wav, flac,
    mp3, ...). field: the request field it came from, which error messages name ("" -> "context[i]")."""

    text: str
    speaker: str
    audio: bytes | None
    field: str = ""


@dataclass(frozen=True)
class CsmPrompt:
    input_ids: np.ndarray  # int32 [T]: the processor's token ids
    frames: torch.Tensor  # int64 [T, K+1]: the backbone's input (text ids; context frames at <|AUDIO|>)


class CsmPrompter:
    """Builds CSM prompts for one model directory: its CsmProcessor (tokenizer, chat template,
    feature extractor) and its Mimi encoder.

    max_prompt_tokens: the longest prompt accepted (default: the backbone's max_position_embeddings
    less one, so at least one frame can follow); max_context_seconds: the context audio's total length."""

    def __init__(self, model_dir: Path | str, device: torch.device | str = "cpu",
                 max_prompt_tokens: int | None = None, max_context_seconds: float = MAX_CONTEXT_SECONDS):
        import transformers

        model_dir = Path(model_dir)
        self.config = read_json(model_dir / "config.json")
        self.num_codebooks = int(self.config.get("num_codebooks", 32))
        self.device = torch.device(device)
        verbosity = transformers.logging.get_verbosity()
        # Loading reads config.json, and CsmConfig warns that text ids exceed the codebook vocabulary, as csm-1b's do.
        transformers.logging.set_verbosity_error()
        try:
            self.processor = transformers.CsmProcessor.from_pretrained(model_dir)
        finally:
            transformers.logging.set_verbosity(verbosity)
        self.sampling_rate = int(self.processor.feature_extractor.sampling_rate)
        positions = int(self.config.get("max_position_embeddings", 2048))
        self.max_prompt_tokens = positions - 1 if max_prompt_tokens is None else int(max_prompt_tokens)
        self.max_context_seconds = float(max_context_seconds)
        # A user's text must not smuggle in markup the tokenizer would read as special tokens (an extra
        # <|AUDIO|> breaks the processor's count; <|end_of_text|> forges a turn).
        specials = sorted({t.content for t in self.processor.tokenizer.added_tokens_decoder.values() if t.content},
                          key=len, reverse=True)
        self._special = re.compile("|".join(map(re.escape, specials))) if specials else None
        codec_config = self.config.get("codec_config")
        if not isinstance(codec_config, dict):
            raise ConfigError(f"{model_dir}/config.json has no codec_config object")
        # MimiConfig straight from the dict: the codec is all that is built here.
        self.codec = _load_codec(model_dir, transformers.MimiConfig.from_dict(codec_config), self.device)
        if self.codec.config.num_quantizers != self.num_codebooks:
            raise ConfigError(f"the codec has {self.codec.config.num_quantizers} quantizers but the model "
                              f"{self.num_codebooks} codebooks")

    def build(self, text: str, speaker: str, context: Sequence[ContextTurn | tuple] = (), *,
              text_field: str = "input", speaker_field: str = "voice") -> CsmPrompt:
        """The prompt for `speaker` saying `text` after the context turns (oldest first). ValueError (naming
        text_field, speaker_field or the turn's field) for a bad speaker, empty text, undecodable or too
        long audio, or a prompt longer than max_prompt_tokens."""
        turns = [ContextTurn(*turn) for turn in context]
        # Cheap checks first: nothing is decoded for a request that fails them.
        self._check_text(text, text_field)
        self._check_speaker(speaker, speaker_field)
        fields = []
        for i, turn in enumerate(turns):
            field = turn.field or f"context[{i}]"
            fields.append(field)
            self._check_text(turn.text, field, "transcript")
            self._check_speaker(turn.speaker, field)
            if turn.audio is None:
                # csm-1b's chat template pairs every earlier turn's text with its audio.
                raise ValueError(f"{field}: a context turn needs its audio")
        clips, total = [], 0.0
        for turn, field in zip(turns, fields):
            # Each file is capped on its own while decoding (bounded work), the sum after.
            clip = decode_audio(turn.audio, field, self.sampling_rate, self.max_context_seconds)
            total += clip.shape[0] / self.sampling_rate
            if total > self.max_context_seconds:
                raise AudioError(f"{field}: the context audio totals {total:.1f} s, over the "
                                 f"{self.max_context_seconds:g} s limit")
            clips.append(clip)

        conversation = [{"role": turn.speaker, "content": [{"type": "text", "text": turn.text},
                                                           {"type": "audio", "path": clip}]}
                        for turn, clip in zip(turns, clips)]
        conversation.append({"role": speaker, "content": [{"type": "text", "text": text}]})
        inputs = self.processor.apply_chat_template(conversation, tokenize=True, return_dict=True)
        input_ids = inputs["input_ids"][0]
        if input_ids.shape[0] > self.max_prompt_tokens:
            # Before the codec runs: the audio's frames are already counted in input_ids.
            where = f"{text_field} and the context" if turns else text_field
            raise ValueError(f"{where}: the prompt is {input_ids.shape[0]} tokens, over the model's "
                             f"{self.max_prompt_tokens}")
        codes = self._encode(inputs) if turns else None
        return CsmPrompt(input_ids.numpy().astype(np.int32), prompt_frames(input_ids, codes, self.config))

    @torch.inference_mode()
    def _encode(self, inputs) -> torch.Tensor:
        """The context clips' codes [N, K] as CsmForConditionalGeneration computes them: one encode per clip
        (the processor concatenated them into input_values, ending each at its cutoff)."""
        values, cutoffs = inputs["input_values"][0].to(self.device), inputs["input_values_cutoffs"][0]
        codes, start = [], 0
        for end in cutoffs[cutoffs >= 0].tolist():
            codes.append(self.codec.encode(values[..., start:end][None]).audio_codes[0].T.cpu())
            start = end
        return torch.cat(codes)

    def _check_text(self, text: str, field: str, what: str = "text") -> None:
        if not isinstance(text, str):
            raise ValueError(f"{field}: the {what} must be a string, got {type(text).__name__}")
        if not text.strip():
            raise ValueError(f"{field}: the {what} is empty")
        found = self._special.search(text) if self._special else None
        if found:
            raise ValueError(f"{field}: the {what} contains the special token {found.group()!r}")

    @staticmethod
    def _check_speaker(speaker: str, field: str) -> None:
        if not isinstance(speaker, str) or not _SPEAKER.fullmatch(speaker):
            raise ValueError(f"{field}: the speaker must be a non-negative integer id ('0', '1', ..., at most 9 digits), got {speaker!r}")


def _load_codec(model_dir: Path, codec_config, device: torch.device):
    """transformers' MimiModel with the checkpoint's `codec_model.*` tensors, float32, eval: only those
    tensors are read, so the backbone's weights never come into memory here."""
    from transformers import MimiModel

    files = {name: file for name, file in weight_files(model_dir).items() if name.startswith(CODEC_PREFIX)}
    if not files:
        raise ConfigError(f"no {CODEC_PREFIX}* weights in {model_dir}'s safetensors files")
    state: dict[str, torch.Tensor] = {}
    for file in sorted(set(files.values())):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                if name in files and files[name] == file:
                    state[name.removeprefix(CODEC_PREFIX)] = f.get_tensor(name)
    # Built on the CPU with random weights, then overwritten: non-persistent buffers (conv strides,
    # RoPE frequencies) are only made by the constructor.
    codec = MimiModel(codec_config).float()
    try:
        codec.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ConfigError(f"{model_dir}: the codec's weights do not fit its codec_config: {e}") from None
    return codec.to(device).eval().requires_grad_(False)
