"""BatonTensorRelay: the smallest graph whose nodes hand each other a float tensor.

    main = a(features) -> h -> b(h) -> out (to the client, modality "audio")

`process_prompt` turns the prompt's UTF-8 bytes into a float32 `features`
tensor; `a` expands it into `h` (float32, [len, width]); `b` mixes `h` down to
samples, which the client gets as raw float32 bytes. Placed on two workers,
`h` (and with `a` away from rank 0, `features`) crosses between workers, so
the placement tests (test/e2e/shm.test.ts) check that a tensor moves through
shared memory and that the bytes equal the colocated run's. No weights: the
mixing is fixed by config.json's `width` and `seed`, so any build is the same.
A request whose model_kwargs hold `fail_in_b` fails in node b (a per-request
failure after its tensor crossed).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ...graph.authoring import EMIT_TO_CLIENT, EngineType, GraphEdge, GraphNode, Sequential
from ...graph.model import GraphModel
from ...graph.node_runner import NodeSubmodule

ARCHITECTURE = "BatonTensorRelay"


class Expand(NodeSubmodule):
    """features [n] -> h [n, width]: a fixed random projection through sin."""

    def __init__(self, width: int, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("weight", torch.randn(width, generator=g))
        self.register_buffer("bias", torch.randn(width, generator=g))

    def forward(self, graph_walk, infos, batch):
        return [{"h": [torch.sin(inputs["features"][0][:, None] * self.weight + self.bias)]} for inputs in batch]


class Mix(NodeSubmodule):
    """h [n, width] -> out [n]: a fixed random mix of the width."""

    def __init__(self, width: int, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed + 1)
        self.register_buffer("mix", torch.randn(width, generator=g))

    def prepare_inputs(self, graph_walk, info, inputs):
        if info.request_kwargs.get("fail_in_b"):
            raise RuntimeError("asked to fail in b")
        return inputs

    def forward(self, graph_walk, infos, batch):
        return [{"out": [inputs["h"][0] @ self.mix]} for inputs in batch]


class BatonTensorRelay(GraphModel):
    def __init__(self, model_dir: str | Path):
        super().__init__()
        config = json.loads((Path(model_dir) / "config.json").read_text())
        self.width = int(config.get("width", 8))
        self.seed = int(config.get("seed", 0))

    def get_node_engine_types(self) -> dict[str, EngineType]:
        return {"a": EngineType.STATELESS, "b": EngineType.STATELESS}

    def get_graph_walk_graphs(self) -> dict:
        return {
            "main": Sequential(
                [
                    GraphNode("a", ["features"], [GraphEdge("b", "h")]),
                    GraphNode("b", ["h"], [GraphEdge(EMIT_TO_CLIENT, "out", output_modality="audio")]),
                ]
            )
        }

    def get_submodule(self, node_name: str, device: torch.device | str = "cpu") -> torch.nn.Module:
        if node_name == "a":
            return Expand(self.width, self.seed).to(device)
        if node_name == "b":
            return Mix(self.width, self.seed).to(device)
        raise ValueError(f"unknown node {node_name!r}")

    def process_prompt(self, prompt, input_modalities, output_modalities, tensors=None, **kwargs):
        data = (prompt or "").encode()
        return {"features": [torch.tensor(list(data), dtype=torch.float32) / 255.0]}

