"""The graph every vision-language model here shares: a stateless `vision`
node and a kv_cache `llm` node, walked `encode` (vision: the prompt's image
values -> image_embeds, persisted: held until the request ends, since a
preempted request recomputes its prompt), `prefill` (llm: the prompt's token
ids, image_embeds, and any further prompt values the model names) and
`decode` (llm, a loop of one token per iteration).

A model subclasses VisionLanguageGraph and says which prompt values its vision
node takes (`vision_inputs`) and which further prompt values its prefill takes
after the token ids and image_embeds (`prefill_prompt_inputs`: Qwen2.5-VL's
rotary positions); nodes, walks and transitions come from here.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

from ..graph.authoring import EMIT_TO_CLIENT, EMPTY_DESTINATION, EngineType, GraphEdge, GraphNode, GraphSection, Loop
from ..graph.model import DEFAULT_PARTITION, GraphModel, PartitionTransitions, WalkInput, WalkStep
from ..model.weights import WeightReader

# The formats a data: URL may carry (image/png, image/jpeg, image/webp).
FORMATS = ("PNG", "JPEG", "WEBP")
# Decompression-bomb guard: PIL warns past ~89M pixels by default; refuse instead.
MAX_PIXELS = 64 * 1024 * 1024

VISION, LLM = "vision", "llm"
TEXT_INPUTS, NEW_TOKEN, IMAGE_EMBEDS = "text_inputs", "new_token", "image_embeds"
ENCODE, PREFILL, DECODE, DECODE_LOOP = "encode", "prefill", "decode", "decode_loop"


class VisionLanguageGraph(GraphModel):
    model_dir: Path
    max_model_len: int
    vision_inputs: tuple[str, ...] = ()
    prefill_prompt_inputs: tuple[str, ...] = ()

    def get_node_engine_types(self) -> dict[str, EngineType]:
        return {VISION: EngineType.STATELESS, LLM: EngineType.KV_CACHE}

    def get_graph_walk_graphs(self) -> dict[str, GraphSection]:
        encode = GraphNode(VISION, list(self.vision_inputs), [GraphEdge(EMPTY_DESTINATION, IMAGE_EMBEDS, persist=True)])
        prefill = GraphNode(
            LLM,
            [TEXT_INPUTS, IMAGE_EMBEDS, *self.prefill_prompt_inputs],
            [
                GraphEdge(EMPTY_DESTINATION, NEW_TOKEN, persist=True, conductor_new_token=True),
                GraphEdge(EMIT_TO_CLIENT, NEW_TOKEN, output_modality="text"),
            ],
        )
        decode = Loop(
            GraphNode(LLM, [TEXT_INPUTS], [GraphEdge(LLM, TEXT_INPUTS), GraphEdge(EMIT_TO_CLIENT, NEW_TOKEN, output_modality="text")]),
            max_iters=self.max_model_len,
            name=DECODE_LOOP,
        )
        return {ENCODE: encode, PREFILL: prefill, DECODE: decode}

    def get_partitions(self) -> dict[str, set[str]]:
        return {DEFAULT_PARTITION: {ENCODE, PREFILL, DECODE}}

    def get_walk_transitions(self) -> dict[str, PartitionTransitions]:
        prefill_inputs = [
            WalkInput(LLM, TEXT_INPUTS, "prompt", TEXT_INPUTS),
            WalkInput(LLM, IMAGE_EMBEDS, "persist", IMAGE_EMBEDS),
            *(WalkInput(LLM, name, "prompt", name) for name in self.prefill_prompt_inputs),
        ]
        return {
            DEFAULT_PARTITION: PartitionTransitions(
                start=WalkStep(ENCODE, [WalkInput(VISION, name, "prompt", name) for name in self.vision_inputs]),
                after={
                    ENCODE: WalkStep(PREFILL, prefill_inputs),
                    PREFILL: WalkStep(DECODE, [WalkInput(LLM, TEXT_INPUTS, "persist", NEW_TOKEN)], release=[NEW_TOKEN]),
                    DECODE: WalkStep(""),
                },
            )
        }

    def get_kv_model_dir(self, node_name: str) -> Path:
        return self.model_dir

    def get_submodule(self, node_name: str, device: str | torch.device = "cpu") -> torch.nn.Module | None:
        """The vision node's module, its weights read from the directory (bfloat16 on a GPU); None for the llm."""
        if node_name == LLM:
            return None
        if node_name != VISION:
            raise KeyError(f"{type(self).__name__} has no node {node_name!r}")
        dtype = torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16
        reader = WeightReader(self.model_dir, dtype, torch.device(device))
        try:
            return self.vision_submodule(reader, dtype)
        finally:
            reader.close()

    def vision_submodule(self, reader: WeightReader, dtype: torch.dtype) -> torch.nn.Module:
        raise NotImplementedError


class MediaError(ValueError):
    """One image of a request cannot be used; the message names its part."""


def decode_image(data: bytes, param: str):
    """The image in `data` (a PIL image), fully decoded: a truncated file fails here, not later. MediaError
    naming the request's part for an empty, unsupported, undecodable or oversized image."""
    from PIL import Image, UnidentifiedImageError

    if len(data) == 0:
        raise MediaError(f"{param}: the image is empty (0 bytes)")
    try:
        image = Image.open(io.BytesIO(data))
        if image.format not in FORMATS:
            raise MediaError(f"{param}: unsupported image format {image.format}; supported: PNG, JPEG, WebP")
        if image.width * image.height > MAX_PIXELS:
            raise MediaError(f"{param}: the image is too large ({image.width}x{image.height} pixels)")
        image.load()
    except MediaError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise MediaError(f"{param}: cannot decode the image: {e}") from None
    if image.width == 0 or image.height == 0:
        raise MediaError(f"{param}: the image has no pixels ({image.width}x{image.height})")
    return image


def prompt_images(kwargs: dict) -> tuple[np.ndarray, list[bytes], list[str]]:
    """process_prompt's keyword arguments for a prompt with images: its token ids, each image's bytes, and
    each image's place in the request (for error messages)."""
    ids = np.asarray(kwargs.get("token_ids", []), np.int64)
    images = [bytes(b) for b in kwargs.get("images", [])]
    params = list(kwargs.get("image_params", [])) or [f"image {i}" for i in range(len(images))]
    return ids, images, params
