"""WhisperForConditionalGeneration as a graph.

Nodes: `encoder` (stateless: the log-mel features of every clip of a step in
one batched STFT, features.py, then the audio encoder, encoder.py, over all of
them in one forward) and `decoder` (kv_cache: decoder.py, whose self-attention
K/V lives in the paged cache like any decoder's and whose cross-attention K/V,
computed once per request from the encoder's output, lives in blocks of the
same cache that the engine allocates and frees with the request's own).
Walks: `encode` (encoder: the window's features -> encoder_states, persisted: a
preempted request recomputes its cross K/V from them), `prefill` (decoder: the
decoder prompt's token ids and encoder_states, AddedRequest.encoder_states),
`decode`.

process_prompt gets the decoder prompt's token ids (the frontend builds them:
<|startofprev|> and earlier text, <|startoftranscript|>, language, task,
<|notimestamps|>) and the uploaded file's bytes; it decodes them (audio.py, a
400 naming the file when that fails) and returns the log-mel features of the
window. Audio up to 30 s is one window, padded to 30 s (features.py). Longer
audio is transcribed window by window as transformers' long-form generate
does: the features of the whole clip, from which the window of 3000 frames
starting at frame `audio_offset` (the frontend's seek) is cut and padded with
zeros. It also returns `audio_samples` and `audio_frames` (the decoded length
and transformers' frame count, which long-form seeks stop at), which no walk
reads: the client gets them (RequestOutput.promptInfo) to plan the windows and
report the duration. The decoder's generation rules (suppressed tokens, timestamps) are
logits_rules.py, applied by the worker to every sampled row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ...graph.model import KvDecoderLayout
from ...graph.node_runner import NodeSubmodule, PassInfo
from ...model.weights import WeightReader
from ..encoder_decoder import TEXT_INPUTS, EncoderDecoderGraph
from .audio import decode_audio
from .decoder import WhisperDecoder, whisper_model_config
from .encoder import WhisperEncoder
from .features import LogMel
from .logits_rules import WhisperLogitsRules

ARCHITECTURE = "WhisperForConditionalGeneration"
# The longest audio a request may decode to (its samples are held while the request runs).
MAX_AUDIO_SECONDS = 3600.0

FEATURES, AUDIO_SAMPLES, AUDIO_FRAMES, ENCODER_STATES = "input_features", "audio_samples", "audio_frames", "encoder_states"


class WhisperAudioEncoder(NodeSubmodule):
    """The window features [mels, frames] of each pass -> encoder_states [max_source_positions, d_model],
    every window of the batch in one encoder forward."""

    def __init__(self, encoder: WhisperEncoder, out_dtype: torch.dtype):
        super().__init__()
        self.encoder, self.out_dtype = encoder, out_dtype

    def preprocess(self, graph_walk: str, infos: list[PassInfo], prepared: list) -> torch.Tensor:
        device = self.encoder.conv1[0].device
        return torch.stack([p[FEATURES][0] for p in prepared]).to(device)

    @torch.inference_mode()
    def forward(self, graph_walk: str, infos: list[PassInfo], batch: torch.Tensor) -> list[dict]:
        states = self.encoder(batch).to(self.out_dtype)
        return [{ENCODER_STATES: [row]} for row in states]


class WhisperGraphModel(EncoderDecoderGraph):
    encoder_node = "encoder"
    decoder_node = "decoder"
    encoder_output = ENCODER_STATES
    encoder_inputs = (FEATURES,)
    kv_input_roles = ("encoder_states",)

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = Path(model_dir)
        self.config = json.loads((self.model_dir / "config.json").read_text())
        self.max_model_len = int(self.config.get("max_target_positions", 448))
        self.features = LogMel.from_dir(self.model_dir)
        eos = self.config.get("eos_token_id", 50256)
        self.eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos])]

    # ---- the nodes -----------------------------------------------------------------

    def get_kv_decoder_layout(self, node_name: str) -> KvDecoderLayout:
        config = self.config
        return KvDecoderLayout(
            None,
            lambda name: name,
            read_config=lambda model_dir: whisper_model_config(config),
            make_decoder=lambda model_config, reader: WhisperDecoder(reader.get, config, reader.device, reader.dtype),
            cross_attention=True,
            logits_rules=WhisperLogitsRules.from_dir,
        )

    def get_stop_token_ids(self, node_name: str) -> list[int]:
        return self.eos_ids if node_name == self.decoder_node else []

    def encoder_submodule(self, reader: WeightReader, dtype: torch.dtype) -> torch.nn.Module:
        return WhisperAudioEncoder(WhisperEncoder(reader.get, self.config), dtype)

    # ---- requests ---------------------------------------------------------------------

    def process_prompt(
        self,
        prompt: str | None,
        input_modalities: Sequence[str],
        output_modalities: Sequence[str],
        tensors: Any = None,
        **kwargs: Any,
    ) -> dict[str, list[torch.Tensor]]:
        ids = np.asarray(kwargs.get("token_ids", []), np.int64)
        data = kwargs.get("audio")
        param = str(kwargs.get("audio_param", "file"))
        if data is None:
            raise ValueError(f"{param}: a transcription needs an audio file")
        samples = decode_audio(bytes(data), param, self.features.sampling_rate, MAX_AUDIO_SECONDS)
        mel = self.features
        frames = mel.num_frames(len(samples)) if len(samples) <= mel.n_samples else -(-len(samples) // mel.hop_length)
        seek = int(kwargs.get("audio_offset", 0))
        if not 0 <= seek < frames:
            raise ValueError(f"{param}: the window at frame {seek} is outside the audio's {frames} frames")
        if len(samples) <= mel.n_samples:
            features = mel([samples])[0]
        else:
            window = mel.whole(samples)[:, seek : seek + min(frames - seek, mel.nb_max_frames)]
            features = torch.nn.functional.pad(window, (0, mel.nb_max_frames - window.shape[1]))
        return {
            TEXT_INPUTS: [torch.from_numpy(ids)],
            FEATURES: [features.cpu()],
            AUDIO_SAMPLES: [torch.tensor([len(samples)], dtype=torch.int64)],
            AUDIO_FRAMES: [torch.tensor([frames], dtype=torch.int64)],
        }
