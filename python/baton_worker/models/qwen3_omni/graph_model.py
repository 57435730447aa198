"""Qwen3-Omni (Qwen3OmniMoeForConditionalGeneration) as a graph, text, audio and
images in, text out: the encoder-decoder graph (encoder_decoder.py) with

- `encoder` (stateless): the thinker's audio encoder (audio.py) and vision
  encoder (vision.py), every clip and every image of a step in one forward
  each; for each request, one row per multimodal position in prompt order,
  [positions, hidden * (1 + D)]: the row that replaces the token's embedding,
  then the D deepstack features the text model adds after its first D layers
  (zeros for an audio row, which transformers adds nothing to);
- `thinker` (kv_cache): the thinker's mixture-of-experts text model over the
  paged cache, read through the decoder layout: its config at config.json's
  thinker_config.text_config, its weights under thinker.model.* and
  thinker.lm_head.*; the encoder's rows replace the <|audio_pad|> and
  <|image_pad|> embeddings (AddedRequest.embeds), its positions are the
  prompt's interleaved multimodal rotary positions (AddedRequest.positions).

One encoder node holds both towers because the thinker takes one row per
multimodal position in prompt order, audio and images interleaved as the
conversation has them: two encoder nodes would give the thinker two row sets
to interleave on every chunk.

process_prompt gets the chat's token ids with one <|audio_pad|> per audio part
and one <|image_pad|> per image part (the frontend cannot know an audio's
token count: it depends on the decoded length), the parts' bytes, and their
places in the request. It decodes each clip (PyAV, mono 16 kHz) into its
log-mel features and each image into its patches, expands every placeholder to
the part's token count (the processor's counts), and computes the positions:
with an image, transformers' get_rope_index, which for audio and text counts
on one position a token and for an image is Qwen2.5-VL's (qwen2_5_vl
rope_positions); without one, plain positions. The expanded prompt's length
goes back to the frontend as `num_prompt_tokens` (the usage it reports).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ...graph.model import KvDecoderLayout
from ...graph.node_runner import NodeSubmodule, PassInfo
from ...model.config import ConfigError, read_json
from ...model.weights import WeightReader
from ..encoder_decoder import TEXT_INPUTS, EncoderDecoderGraph
from ..qwen2_5_vl.graph_model import qwen_images, rope_positions
from ..vision_language import MediaError, prompt_images
from ..whisper.audio import decode_audio
from .audio import AudioFeatures, Qwen3OmniAudioEncoder, audio_config, num_audio_tokens
from .vision import Qwen3OmniVisionEncoder, read_image_processor_config, vision_config

ENCODER, THINKER = "encoder", "thinker"
TEXT_CONFIG = "thinker_config.text_config"
AUDIO_FEATURES, PIXEL_VALUES, IMAGE_GRID = "input_features", "pixel_values", "image_grid_thw"
MEDIA_ORDER, POSITIONS, MM_EMBEDS = "media_order", "positions", "mm_embeds"
NUM_PROMPT_TOKENS = "num_prompt_tokens"
AUDIO, IMAGE = 0, 1  # media_order's entries
AUDIO_TOKEN_ID, IMAGE_TOKEN_ID = 151675, 151655
# The processor takes clips of any length; a bound keeps one request from holding the encoder for minutes.
MAX_AUDIO_SECONDS = 600.0


def _thinker_name(name: str) -> str:
    """A plain decoder's weight name -> the stored one (thinker.model.*, thinker.lm_head.*)."""
    return "thinker." + name


class OmniEncoder(NodeSubmodule):
    """Each pass's clips (input_features, one [mel, frames] tensor a clip), images (pixel_values, image_grid_thw)
    and media_order (AUDIO / IMAGE per part in prompt order) -> mm_embeds [positions, hidden * (1 + D)]:
    the audio tower over every clip of the batch in one forward, the vision tower over every image in one."""

    def __init__(self, audio: Qwen3OmniAudioEncoder, vision: Qwen3OmniVisionEncoder, hidden: int, out_dtype: torch.dtype):
        super().__init__()
        self.audio, self.vision, self.hidden, self.out_dtype = audio, vision, hidden, out_dtype
        self.width = hidden * (1 + len(vision.deepstack_indexes))

    def preprocess(self, graph_walk: str, infos: list[PassInfo], prepared: list) -> list:
        return prepared

    @torch.inference_mode()
    def forward(self, graph_walk: str, infos: list[PassInfo], batch: list) -> list[dict]:
        clips = [f for p in batch for f in p[AUDIO_FEATURES]]
        pixels = [t for p in batch for t in p[PIXEL_VALUES]]
        grids = [t for p in batch for t in p[IMAGE_GRID]]
        audio_rows = self.audio(clips).split([self.audio.num_tokens(f.shape[1]) for f in clips]) if clips else []
        if grids:
            grid = torch.cat(grids)
            embeds, deepstack = self.vision(torch.cat(pixels), grid)
            image_rows = torch.cat([embeds, *deepstack], dim=1).split(self.vision.tokens_per_image(grid))
        else:
            image_rows = []
        out, a, i = [], 0, 0
        for p in batch:
            parts = []
            for kind in (p[MEDIA_ORDER][0].tolist() if p[MEDIA_ORDER] else []):
                if kind == AUDIO:
                    rows = audio_rows[a]
                    a += 1
                    parts.append(torch.cat([rows, rows.new_zeros(rows.shape[0], self.width - rows.shape[1])], dim=1))
                else:
                    parts.append(image_rows[i])
                    i += 1
            device = self.vision.patch_weight.device
            rows = torch.cat(parts) if parts else torch.zeros(0, self.width, device=device)
            out.append({MM_EMBEDS: [rows.to(self.out_dtype)]})
        return out


class Qwen3OmniGraphModel(EncoderDecoderGraph):
    encoder_node = ENCODER
    decoder_node = THINKER
    encoder_output = MM_EMBEDS
    encoder_inputs = (AUDIO_FEATURES, PIXEL_VALUES, IMAGE_GRID, MEDIA_ORDER)
    prefill_prompt_inputs = (POSITIONS,)

    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        self.config = read_json(self.model_dir / "config.json")
        thinker = self.config.get("thinker_config") or {}
        text = thinker.get("text_config")
        if not isinstance(text, dict):
            raise ConfigError(f"{self.model_dir}/config.json has no thinker_config.text_config object")
        self.max_model_len = int(text.get("max_position_embeddings", 32768))
        self.hidden = int(text["hidden_size"])
        self.audio_token_id = int(thinker.get("audio_token_id", AUDIO_TOKEN_ID))
        self.image_token_id = int(thinker.get("image_token_id", IMAGE_TOKEN_ID))
        self.vision = vision_config(self.config)
        self.merge = int(self.vision.get("spatial_merge_size", 2))
        self.deepstack_layers = len(self.vision.get("deepstack_visual_indexes") or [])
        self.processing = read_image_processor_config(self.model_dir)
        self.features = AudioFeatures.from_dir(self.model_dir)
        self.n_window = int(audio_config(self.config).get("n_window", 50))

    # ---- the nodes -----------------------------------------------------------------

    def get_kv_decoder_layout(self, node_name: str) -> KvDecoderLayout:
        return KvDecoderLayout(TEXT_CONFIG, _thinker_name, (self.audio_token_id, self.image_token_id), self.deepstack_layers)

    def encoder_submodule(self, reader: WeightReader, dtype: torch.dtype) -> torch.nn.Module:
        audio = Qwen3OmniAudioEncoder(reader.get, audio_config(self.config))
        vision = Qwen3OmniVisionEncoder(reader.get, self.vision)
        return OmniEncoder(audio, vision, self.hidden, dtype)

    # ---- requests ---------------------------------------------------------------------

    def process_prompt(
        self,
        prompt: str | None,
        input_modalities: Sequence[str],
        output_modalities: Sequence[str],
        tensors: Any = None,
        **kwargs: Any,
    ) -> dict[str, list[torch.Tensor]]:
        ids, images, image_params = prompt_images(kwargs)
        audios = [bytes(b) for b in kwargs.get("audios", [])]
        audio_params = list(kwargs.get("audio_params", [])) or [f"audio {i}" for i in range(len(audios))]
        is_audio, is_image = ids == self.audio_token_id, ids == self.image_token_id
        if int(is_audio.sum()) != len(audios):
            raise MediaError(f"the prompt holds {int(is_audio.sum())} audio placeholders for {len(audios)} audio parts")
        if int(is_image.sum()) != len(images):
            raise MediaError(f"the prompt holds {int(is_image.sum())} image placeholders for {len(images)} images")

        features = []
        for data, param in zip(audios, audio_params):
            samples = decode_audio(data, param, self.features.sampling_rate, MAX_AUDIO_SECONDS)
            try:
                features.extend(self.features([samples]))
            except ValueError as error:  # a clip too short for one STFT frame
                raise MediaError(f"{param}: {error}") from None
        pixels, grids = qwen_images(images, image_params, self.processing)

        # Each placeholder becomes its part's run of tokens, in prompt order.
        audio_counts = iter([self._audio_tokens(f.shape[1]) for f in features])
        image_counts = iter((grids.prod(dim=1) // self.merge**2).tolist())
        runs, order = [], []
        for token in ids.tolist():
            if token == self.audio_token_id:
                runs.append(np.full(next(audio_counts), token, np.int64))
                order.append(AUDIO)
            elif token == self.image_token_id:
                runs.append(np.full(next(image_counts), token, np.int64))
                order.append(IMAGE)
            else:
                runs.append(np.array([token], np.int64))
        expanded = np.concatenate(runs) if runs else ids
        if images:
            positions = rope_positions(expanded, grids.numpy(), self.image_token_id, self.merge)
        else:
            positions = np.broadcast_to(np.arange(len(expanded), dtype=np.int64), (3, len(expanded))).copy()
        return {
            TEXT_INPUTS: [torch.from_numpy(expanded)],
            AUDIO_FEATURES: [f.cpu() for f in features],
            PIXEL_VALUES: [pixels] if images else [],
            IMAGE_GRID: [grids] if images else [],
            MEDIA_ORDER: [torch.tensor(order, dtype=torch.int64)] if order else [],
            POSITIONS: [torch.from_numpy(positions)],
            NUM_PROMPT_TOKENS: [torch.tensor([len(expanded)], dtype=torch.int64)],
        }

    def _audio_tokens(self, frames: int) -> int:
        return num_audio_tokens(frames, self.n_window)
