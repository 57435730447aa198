"""LlavaForConditionalGeneration as a graph.

Nodes: `vision` (stateless: CLIP vision tower + projector, batched over every
image of a step) and `llm` (kv_cache: the text model, any decoder Baton serves).
Walks: `encode` (vision: pixel_values -> image_embeds, persisted), `prefill`
(llm: the prompt's token ids and image_embeds, whose rows replace the
embeddings at the image-token positions: AddedRequest.embeds), `decode`.

process_prompt gets the prompt's token ids (already holding one image token
per image feature, as transformers' LlavaProcessor expands them) and each
image's bytes; it decodes and preprocesses the images (preprocess.py). A
request without images runs the vision node on nothing (one empty pass).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ...graph.model import KvDecoderLayout
from ...model.config import ConfigError
from ...model.weights import WeightReader, weight_files
from .preprocess import ImageProcessing, MediaError
from .vision import PIXEL_VALUES, LlavaVision

from ..vision_language import TEXT_INPUTS, VisionLanguageGraph, prompt_images

ARCHITECTURE = "LlavaForConditionalGeneration"


def _prefixes(names: set[str]) -> tuple[str, str, str, str]:
    """(decoder body, lm_head, vision tower, projector) prefixes of the stored weight names:
    llava-hf's (language_model.model., vision_tower.vision_model.) or transformers 5's (model.language_model., ...)."""

    def first(candidates: Sequence[str], probe: str) -> str:
        for c in candidates:
            if c + probe in names:
                return c
        raise ConfigError(f"no weight {probe!r} under any of {', '.join(candidates)}")

    body = first(["language_model.model.", "model.language_model.", "model."], "embed_tokens.weight")
    head = next((c for c in ["language_model.lm_head.", "lm_head."] if c + "weight" in names), "lm_head.")
    vision = first(["vision_tower.vision_model.", "vision_tower.", "model.vision_tower.vision_model.", "model.vision_tower."], "embeddings.class_embedding")
    projector = first(["multi_modal_projector.", "model.multi_modal_projector."], "linear_1.weight")
    return body, head, vision, projector


class LlavaGraphModel(VisionLanguageGraph):
    encoder_inputs = (PIXEL_VALUES,)

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = Path(model_dir)
        self.config = json.loads((self.model_dir / "config.json").read_text())
        text = self.config.get("text_config") or {}
        self.vision_config = self.config.get("vision_config") or {}
        self.image_token_id = int(self.config.get("image_token_index", self.config.get("image_token_id", 32000)))
        self.max_model_len = int(text.get("max_position_embeddings", 4096))
        strategy = self.config.get("vision_feature_select_strategy", "default")
        if strategy not in ("default", "full"):
            raise ConfigError(f"unsupported vision_feature_select_strategy {strategy!r}; supported: default, full")
        self.select_strategy = strategy
        self.feature_layers = self.config.get("vision_feature_layer", -2)
        self.processing = ImageProcessing.from_dir(self.model_dir, int(self.vision_config.get("image_size", 336)))
        self.body, self.head, self.vision_prefix, self.projector_prefix = _prefixes(set(weight_files(self.model_dir)))

    # ---- the nodes -----------------------------------------------------------------

    def get_kv_decoder_layout(self, node_name: str) -> KvDecoderLayout:
        body, head = self.body, self.head

        def rename(name: str) -> str:
            if name.startswith("model."):
                return body + name[len("model.") :]
            if name.startswith("lm_head."):
                return head + name[len("lm_head.") :]
            return name

        return KvDecoderLayout("text_config", rename, (self.image_token_id,))

    def encoder_submodule(self, reader: WeightReader, dtype: torch.dtype) -> torch.nn.Module:
        return LlavaVision(
            reader,
            self.vision_prefix,
            self.projector_prefix,
            self.vision_config,
            self.feature_layers,
            self.select_strategy,
            self.config.get("projector_hidden_act", "gelu"),
            dtype,
        )

    def tokens_per_image(self) -> int:
        """Features the vision node gives one image: patches of the cropped image, plus CLS with "full"."""
        patch = int(self.vision_config.get("patch_size", 14))
        height, width = self.processing.crop if self.processing.do_center_crop else (self.processing.shortest_edge,) * 2
        return (height // patch) * (width // patch) + (1 if self.select_strategy == "full" else 0)

    # ---- requests ---------------------------------------------------------------------

    def process_prompt(
        self,
        prompt: str | None,
        input_modalities: Sequence[str],
        output_modalities: Sequence[str],
        tensors: Any = None,
        **kwargs: Any,
    ) -> dict[str, list[torch.Tensor]]:
        ids, images, params = prompt_images(kwargs)
        counts = list(kwargs.get("image_token_counts", []))
        if len(counts) != len(images) or len(params) != len(images):
            raise ValueError(f"{len(images)} images with {len(counts)} token counts and {len(params)} names")
        per_image = self.tokens_per_image()
        if any(count != per_image for count in counts):
            raise MediaError(f"image token runs of {counts} tokens; this model gives {per_image} features per image")
        if int((ids == self.image_token_id).sum()) != sum(counts):
            raise MediaError(f"the prompt holds {int((ids == self.image_token_id).sum())} image tokens for {len(images)} images")
        pixels = [self.processing.pixel_values(self.processing.decode(bytes(data), param)) for data, param in zip(images, params)]
        return {
            TEXT_INPUTS: [torch.from_numpy(ids)],
            PIXEL_VALUES: [torch.from_numpy(np.stack(pixels))] if pixels else [],
        }
