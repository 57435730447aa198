"""BatonDemoImage: the demo image model declared as a graph (the only file that touches the authoring API).

    walk "generate" = Sequential:
      text_encoder(prompt_ids) -> text_embeds
      Loop "denoise_loop" (max_iters = max_inference_steps) of
          denoiser(latents, text_embeds, step) -> latents, step (loop-back)
        outputs: latents (the last iteration's) -> vae_decoder
      vae_decoder(latents) -> image (to the client, modality "image": PNG bytes)

All three nodes are stateless; the worker runs each as one forward per batch
of passes, whatever requests they belong to (pipeline.py). process_prompt
gives the prompt ids (inline token ids), the seeded initial latents and
step 0; the start transition feeds them to the encoder and to the denoiser's
loop-back inputs. A request runs exactly its `num_inference_steps`
iterations: the denoiser's check_stop stops denoise_loop on the pass whose
step reaches it (the stop takes effect at the end of that iteration, whose
latents are the loop's output); max_iters is only the cap.

Request kwargs (the image endpoint sets them): prompt via process_prompt's
prompt; `size` ("WxH", one of the config's sizes), `seed` and `index` (which
image of the request: the noise comes from noise_seed(seed, index)),
`num_inference_steps`.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import torch

from ...graph.authoring import EMIT_TO_CLIENT, EngineType, GraphEdge, GraphNode, Loop, Sequential
from ...graph.model import DEFAULT_PARTITION, GraphModel, PartitionTransitions, WalkInput, WalkStep
from ...graph.node_runner import NodeSubmodule
from .pipeline import DemoImagePipeline
from .png import encode_png, to_pixels
from .spec import DemoImageSpec, initial_latents, prompt_ids

TEXT_ENCODER = "text_encoder"
DENOISER = "denoiser"
DECODER = "vae_decoder"
DENOISE_LOOP = "denoise_loop"
WALK = "generate"


def _integer(name: str, value) -> int:
    """A request kwarg that must be an integer. The control plane's msgpack carries JS
    integers beyond 32 bits (seeds) as float64, so an integral float counts."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return value


def _steps_of(spec: DemoImageSpec, kwargs) -> int:
    steps = kwargs.get("num_inference_steps", spec.generation.default_inference_steps)
    return spec.check_steps(_integer("num_inference_steps", steps))


class TextEncoderNode(NodeSubmodule):
    def __init__(self, pipeline: DemoImagePipeline):
        super().__init__()
        self.pipeline = pipeline

    def prepare_inputs(self, graph_walk, info, inputs):
        return torch.cat([t.reshape(-1) for t in inputs["prompt_ids"]])

    def forward(self, graph_walk, infos, batch):
        return [{"text_embeds": [e]} for e in self.pipeline.encode_text(batch)]


class DenoiserNode(NodeSubmodule):
    """One DDIM step for every pass of the batch, as one forward per image size."""

    def __init__(self, pipeline: DemoImagePipeline):
        super().__init__()
        self.pipeline = pipeline

    def prepare_inputs(self, graph_walk, info, inputs):
        (latents,) = inputs["latents"]
        (text,) = inputs["text_embeds"]
        (step,) = inputs["step"]
        return latents, text, int(step), _steps_of(self.pipeline.spec, info.request_kwargs)

    def forward(self, graph_walk, infos, batch):
        latents = self.pipeline.denoise_step([b[0] for b in batch], [b[1] for b in batch], [b[2] for b in batch], [b[3] for b in batch])
        return [{"latents": [x], "step": [torch.tensor(b[2] + 1)]} for x, b in zip(latents, batch)]

    def check_stop(self, graph_walk, info, outputs):
        (step,) = outputs["step"]
        return {DENOISE_LOOP} if int(step) >= _steps_of(self.pipeline.spec, info.request_kwargs) else set()


class DecoderNode(NodeSubmodule):
    def __init__(self, pipeline: DemoImagePipeline):
        super().__init__()
        self.pipeline = pipeline

    def prepare_inputs(self, graph_walk, info, inputs):
        (latents,) = inputs["latents"]
        return latents

    def forward(self, graph_walk, infos, batch):
        return [{"image": [image]} for image in self.pipeline.decode(batch)]


class BatonDemoImage(GraphModel):
    def __init__(self, model_dir: str | Path):
        super().__init__()
        self.model_dir = Path(model_dir)
        self.spec = DemoImageSpec.from_dir(self.model_dir)
        self._pipeline: DemoImagePipeline | None = None

    def pipeline(self, device: torch.device | str) -> DemoImagePipeline:
        # One copy of the weights for the three nodes of a worker.
        if self._pipeline is None:
            self._pipeline = DemoImagePipeline.load(self.model_dir, device)
        return self._pipeline

    def get_node_engine_types(self) -> dict[str, EngineType]:
        return {TEXT_ENCODER: EngineType.STATELESS, DENOISER: EngineType.STATELESS, DECODER: EngineType.STATELESS}

    def get_graph_walk_graphs(self) -> dict:
        return {
            WALK: Sequential(
                [
                    GraphNode(TEXT_ENCODER, ["prompt_ids"], [GraphEdge(DENOISER, "text_embeds")]),
                    Loop(
                        GraphNode(
                            DENOISER,
                            ["latents", "text_embeds", "step"],
                            [GraphEdge(DENOISER, "latents"), GraphEdge(DENOISER, "step")],
                        ),
                        max_iters=self.spec.generation.max_inference_steps,
                        outputs=[GraphEdge(DECODER, "latents")],
                        name=DENOISE_LOOP,
                    ),
                    GraphNode(DECODER, ["latents"], [GraphEdge(EMIT_TO_CLIENT, "image", output_modality="image")]),
                ]
            )
        }

    def get_walk_transitions(self) -> dict[str, PartitionTransitions]:
        start = WalkStep(
            WALK,
            inputs=[
                WalkInput(TEXT_ENCODER, "prompt_ids", "prompt", "prompt_ids"),
                WalkInput(DENOISER, "latents", "prompt", "latents"),
                WalkInput(DENOISER, "step", "prompt", "step"),
            ],
        )
        return {DEFAULT_PARTITION: PartitionTransitions(start=start, after={WALK: WalkStep("")})}

    def process_prompt(self, prompt, input_modalities, output_modalities, tensors=None, **kwargs):
        size = kwargs.get("size", self.spec.generation.default_size)
        _steps_of(self.spec, kwargs)
        seed = kwargs.get("seed")
        seed = secrets.randbits(63) if seed is None else _integer("seed", seed)
        index = _integer("index", kwargs.get("index", 0))
        return {
            "prompt_ids": [prompt_ids(prompt or "", self.spec.text)],
            "latents": [initial_latents(self.spec, str(size), seed, index)],
            "step": [torch.tensor(0)],
        }

    def get_submodule(self, node_name: str, device: torch.device | str = "cpu") -> torch.nn.Module:
        nodes = {TEXT_ENCODER: TextEncoderNode, DENOISER: DenoiserNode, DECODER: DecoderNode}
        if node_name not in nodes:
            raise ValueError(f"unknown node {node_name!r}")
        return nodes[node_name](self.pipeline(device))

    def postprocess(self, output: torch.Tensor, modality: str, request_kwargs: dict | None = None) -> bytes:
        if modality != "image":
            raise ValueError(f"BatonDemoImage emits images only, not {modality!r}")
        return encode_png(to_pixels(output))
