"""Qwen3-Omni (Qwen3OmniMoeForConditionalGeneration) as a graph, text in and
text out for now: the `thinker` node, the thinker's mixture-of-experts text
model over the paged KV cache, walks `prefill` and `decode` (the plain LLM's
graph, graph/llm.py, with the node named for what it is). A text chat's
prompt is token ids only, so the engine core serves it as it serves any
decoder.

The directory is the whole model (thinker, talker, code2wav); the thinker's
text model is read from it through the decoder layout: its config at
config.json's thinker_config.text_config (a Qwen3-MoE decoder: q/k norms,
experts, and multimodal rotary sections that text-only positions do not use)
and its weights under thinker.model.* and thinker.lm_head.*.
"""

from __future__ import annotations

from pathlib import Path

from ...graph.llm import LLMGraphModel
from ...graph.model import KvDecoderLayout
from ...model.config import ConfigError, read_json

THINKER = "thinker"
TEXT_CONFIG = "thinker_config.text_config"


def _thinker_name(name: str) -> str:
    """A plain decoder's weight name -> the stored one (thinker.model.*, thinker.lm_head.*)."""
    return "thinker." + name


class Qwen3OmniGraphModel(LLMGraphModel):
    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        config = read_json(self.model_dir / "config.json")
        text = (config.get("thinker_config") or {}).get("text_config")
        if not isinstance(text, dict):
            raise ConfigError(f"{self.model_dir}/config.json has no thinker_config.text_config object")
        super().__init__(int(text.get("max_position_embeddings", 32768)), THINKER)

    def get_kv_model_dir(self, node_name: str) -> Path:
        if node_name != THINKER:
            raise ValueError(f"node {node_name!r} is not a kv_cache node of Qwen3-Omni")
        return self.model_dir

    def get_kv_decoder_layout(self, node_name: str) -> KvDecoderLayout:
        return KvDecoderLayout(TEXT_CONFIG, _thinker_name)
