"""Models that ship with Baton: the demo LLM's builder (demo_llm.py), the graph
models (each a package with its builder), and the registry the worker loads
graph models through.

A model directory whose config.json `architectures[0]` is a key of
GRAPH_ARCHITECTURES is served as that graph model: the worker constructs the
class with the directory (`cls(model_dir)`). Any other directory is a plain
Hugging Face LLM (the one-node graph). Entries are "module:Class" strings,
imported on lookup, so importing a model's builder or reference never pulls in
the graph runtime.
"""

from __future__ import annotations

import importlib

from .demo_image.spec import ARCHITECTURE as DEMO_IMAGE
from .demo_tts.spec import ARCHITECTURE as DEMO_TTS

GRAPH_ARCHITECTURES: dict[str, str] = {
    DEMO_TTS: "baton_worker.models.demo_tts.graph_model:BatonDemoTTS",
    # Two stateless nodes passing a float tensor: what the placement tests move between workers.
    "BatonTensorRelay": "baton_worker.models.tensor_relay:BatonTensorRelay",
    DEMO_IMAGE: "baton_worker.models.demo_image.graph_model:BatonDemoImage",
    # A Hugging Face LLaVA directory: the vision node feeding the LLM's prefill.
    "LlavaForConditionalGeneration": "baton_worker.models.llava.graph_model:LlavaGraphModel",
    # Qwen2.5-VL: the windowed ViT feeding a text model with multimodal rotary positions.
    "Qwen2_5_VLForConditionalGeneration": "baton_worker.models.qwen2_5_vl.graph_model:Qwen25VLGraphModel",
    # Whisper: the audio encoder feeding a decoder that cross-attends it (speech to text).
    "WhisperForConditionalGeneration": "baton_worker.models.whisper.graph_model:WhisperGraphModel",
    # CSM: the backbone (and its depth decoder) streaming frames to Mimi's decoder (text to speech).
    "CsmForConditionalGeneration": "baton_worker.models.csm.graph_model:CsmGraphModel",
    # Qwen3-Omni: the thinker's mixture-of-experts text model (text chat; the encoders and the talker come next).
    "Qwen3OmniMoeForConditionalGeneration": "baton_worker.models.qwen3_omni.graph_model:Qwen3OmniGraphModel",
}


def graph_model_class(architecture: str | None) -> type | None:
    """The GraphModel subclass registered for `architecture`, or None (a plain LLM)."""
    target = GRAPH_ARCHITECTURES.get(architecture) if isinstance(architecture, str) else None
    if target is None:
        return None
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)
