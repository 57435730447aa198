"""Qwen2_5_VLForConditionalGeneration as a graph.

Nodes: `vision` (stateless: the windowed ViT and patch merger, vision.py,
batched over every image of a step) and `llm` (kv_cache: the Qwen2 text model
with multimodal rotary positions). Walks: `encode` (vision: pixel_values and
image_grid_thw -> image_embeds, persisted), `prefill` (llm: the prompt's token
ids, image_embeds replacing the embeddings at the <|image_pad|> positions
(AddedRequest.embeds), and the prompt's (t, h, w) rotary positions
(AddedRequest.positions)), `decode`.

process_prompt gets the prompt's token ids (each image already expanded to
its <|image_pad|> run, as transformers' processor expands it) and each
image's bytes; it decodes and preprocesses the images (preprocess.py: the
size each image is resized to decides its run length) and computes the
prompt's rotary positions as transformers' get_rope_index does for images
(rope_positions). A request without images runs the vision node on nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ...graph.model import KvDecoderLayout
from ...graph.node_runner import NodeSubmodule, PassInfo
from ...model.config import ConfigError
from ...model.weights import WeightReader, weight_files
from .preprocess import image_token_count, preprocess_images, read_preprocessor_config
from .vision import Qwen25VisionTower

from ..vision_language import IMAGE_EMBEDS, TEXT_INPUTS, MediaError, VisionLanguageGraph, decode_image, prompt_images

ARCHITECTURE = "Qwen2_5_VLForConditionalGeneration"
PIXEL_VALUES, IMAGE_GRID, POSITIONS = "pixel_values", "image_grid_thw", "positions"


def rope_positions(ids: np.ndarray, grids: np.ndarray, image_token_id: int, merge: int) -> np.ndarray:
    """The prompt's multimodal rotary positions [3, len(ids)], as transformers' Qwen2.5-VL get_rope_index
    computes them for text and images: a text token's three streams are its running position; an image's
    run of tokens takes (t, h, w) over its merged grid from the running position, which then advances by
    the larger of the merged height and width."""
    positions = np.zeros((3, len(ids)), np.int64)
    is_image = ids == image_token_id
    edges = np.flatnonzero(np.diff(is_image.astype(np.int8))) + 1
    starts = np.concatenate(([0], edges))
    ends = np.concatenate((edges, [len(ids)]))
    current, image = 0, 0
    for start, end in zip(starts.tolist(), ends.tolist()):
        if end <= start:
            continue
        if not is_image[start]:
            positions[:, start:end] = np.arange(end - start) + current
            current += end - start
            continue
        if image >= len(grids):
            raise MediaError(f"the prompt has more image-token runs than its {len(grids)} images")
        t, h, w = (int(v) for v in grids[image])
        image += 1
        gh, gw = h // merge, w // merge
        if end - start != t * gh * gw:
            raise MediaError(f"image {image - 1}: a run of {end - start} image tokens for {t * gh * gw} features")
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(gh), np.arange(gw), indexing="ij")
        positions[:, start:end] = np.stack((tt.ravel(), hh.ravel(), ww.ravel())) + current
        current += max(h, w) // merge
    if image != len(grids):
        raise MediaError(f"{len(grids)} images but {image} image-token runs in the prompt")
    return positions


def qwen_images(images: list[bytes], params: list[str], processing: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """A prompt's images decoded and preprocessed as the Qwen2-VL image processor does: (pixel_values,
    image_grid_thw), empty for none; MediaError naming the part for an image that cannot be used."""
    decoded = [decode_image(data, param) for data, param in zip(images, params)]
    if not decoded:
        return torch.zeros(0, 1), torch.zeros(0, 3, dtype=torch.int64)
    try:
        return preprocess_images(decoded, processing)
    except ValueError as error:  # an aspect ratio the processor refuses (over 200:1)
        raise MediaError(f"{', '.join(params)}: {error}") from None


class QwenVision(NodeSubmodule):
    """pixel_values [patches, C*T*P*P] and image_grid_thw [images, 3] of each pass -> image_embeds [image tokens, text hidden],
    one forward over every image of the batch."""

    def __init__(self, tower: Qwen25VisionTower, merge: int, out_dtype: torch.dtype):
        super().__init__()
        self.tower, self.merge, self.out_dtype = tower, merge, out_dtype

    def preprocess(self, graph_walk: str, infos: list[PassInfo], prepared: list) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        pixels = [torch.cat(p[PIXEL_VALUES]) if p[PIXEL_VALUES] else None for p in prepared]
        grids = [torch.cat(p[IMAGE_GRID]) if p[IMAGE_GRID] else None for p in prepared]
        counts = [0 if g is None else int((g[:, 0] * g[:, 1] * g[:, 2]).sum()) // self.merge**2 for g in grids]
        present = [i for i, g in enumerate(grids) if g is not None and g.shape[0] > 0]
        if not present:
            return torch.zeros(0, 1), torch.zeros(0, 3, dtype=torch.int64), counts
        return torch.cat([pixels[i] for i in present]), torch.cat([grids[i] for i in present]), counts

    @torch.inference_mode()
    def forward(self, graph_walk: str, infos: list[PassInfo], batch) -> list[dict]:
        pixels, grids, counts = batch
        if grids.shape[0] == 0:
            return [{IMAGE_EMBEDS: [torch.zeros(0, self.tower.out_hidden, dtype=self.out_dtype)]} for _ in counts]
        rows = self.tower(pixels, grids).to(self.out_dtype)
        out, at = [], 0
        for n in counts:
            out.append({IMAGE_EMBEDS: [rows[at : at + n]]})
            at += n
        return out


class Qwen25VLGraphModel(VisionLanguageGraph):
    encoder_inputs = (PIXEL_VALUES, IMAGE_GRID)
    prefill_prompt_inputs = (POSITIONS,)

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = Path(model_dir)
        self.config = json.loads((self.model_dir / "config.json").read_text())
        text = self.config.get("text_config") or {}
        self.vision_config = self.config.get("vision_config") or {}
        self.image_token_id = int(self.config.get("image_token_id", 151655))
        self.merge = int(self.vision_config.get("spatial_merge_size", 2))
        self.max_model_len = int(text.get("max_position_embeddings", 32768))
        self.processing = read_preprocessor_config(self.model_dir)
        names = set(weight_files(self.model_dir))
        self.vision_prefix = next((p for p in ("visual.", "model.visual.") if p + "patch_embed.proj.weight" in names), None)
        if self.vision_prefix is None:
            raise ConfigError(f"{self.model_dir}: no vision tower weights (visual.patch_embed.proj.weight)")
        # transformers 5 saves the text model as the plain decoder's names (model.*, lm_head.*); older files nest it.
        self.body = next((p for p in ("model.", "model.language_model.") if p + "embed_tokens.weight" in names), "model.")

    # ---- the nodes -----------------------------------------------------------------

    def get_kv_decoder_layout(self, node_name: str) -> KvDecoderLayout:
        body = self.body

        def rename(name: str) -> str:
            return body + name[len("model.") :] if name.startswith("model.") else name

        return KvDecoderLayout("text_config", rename, (self.image_token_id,))

    def encoder_submodule(self, reader: WeightReader, dtype: torch.dtype) -> torch.nn.Module:
        return QwenVision(Qwen25VisionTower(reader.get, self.vision_prefix, self.vision_config), self.merge, dtype)

    def tokens_for_image(self, width: int, height: int) -> int:
        """The <|image_pad|> tokens an image of this size becomes (after the processor's resize)."""
        return image_token_count(width, height, self.processing)

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
        pixels, grids = qwen_images(images, params, self.processing)
        positions = rope_positions(ids, grids.numpy(), self.image_token_id, self.merge)
        return {
            TEXT_INPUTS: [torch.from_numpy(ids)],
            PIXEL_VALUES: [pixels] if images else [],
            IMAGE_GRID: [grids] if images else [],
            POSITIONS: [torch.from_numpy(positions)],
        }
