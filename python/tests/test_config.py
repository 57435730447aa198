"""config.json reading across families and transformers versions, and rope frequencies vs transformers."""

from __future__ import annotations

import json

import pytest
import torch

from baton_worker.model.config import ConfigError, RopeConfig, load_model_config
from baton_worker.model.rope import inverse_frequencies

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}


def write(tmp_path, **extra):
    (tmp_path / "config.json").write_text(json.dumps(BASE | extra))
    return tmp_path


def test_old_style_rope_scaling(tmp_path):
    cfg = load_model_config(write(tmp_path, rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}))
    assert cfg.rope.rope_type == "llama3" and cfg.rope.theta == 500000.0 and cfg.rope.factor == 8.0
    assert cfg.num_kv_heads == 4 and cfg.head_dim == 16


def test_legacy_type_key_and_linear(tmp_path):
    cfg = load_model_config(write(tmp_path, rope_scaling={"type": "linear", "factor": 2.0}))
    assert (cfg.rope.rope_type, cfg.rope.factor, cfg.rope.theta) == ("linear", 2.0, 10000.0)


def test_unsupported_rope_type(tmp_path):
    with pytest.raises(ConfigError, match="unsupported rope_type 'yarn'"):
        load_model_config(write(tmp_path, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}))


def test_mistral_sliding_window_and_qwen2_bias(tmp_path):
    cfg = load_model_config(write(tmp_path, architectures=["MistralForCausalLM"], sliding_window=4096))
    assert cfg.sliding_windows == [4096, 4096]
    cfg = load_model_config(write(tmp_path, architectures=["Qwen2ForCausalLM"], sliding_window=4096, use_sliding_window=False))
    assert cfg.sliding_windows == [None, None] and cfg.qkv_bias and not cfg.o_bias


def test_eos_from_generation_config(tmp_path):
    write(tmp_path, eos_token_id=2)
    assert load_model_config(tmp_path).eos_token_ids == [2]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 8]}))
    assert load_model_config(tmp_path).eos_token_ids == [7, 8]


def test_missing_field_and_lenient(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 10}))
    with pytest.raises(ConfigError, match="missing 'hidden_size'"):
        load_model_config(tmp_path)
    assert load_model_config(tmp_path, lenient=True).vocab_size == 10


@pytest.mark.parametrize(
    "params",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    ],
)
def test_inverse_frequencies_match_transformers(params):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = LlamaConfig(hidden_size=128, num_attention_heads=4, rope_parameters=dict(params))
    if params["rope_type"] == "default":
        rotary = __import__("transformers").models.llama.modeling_llama.LlamaRotaryEmbedding
        expected = rotary.compute_default_rope_parameters(hf_config)[0]
    else:
        expected = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf_config, "cpu")[0]
    rope = RopeConfig(
        rope_type=params["rope_type"], theta=params["rope_theta"], factor=params.get("factor", 1.0),
        low_freq_factor=params.get("low_freq_factor", 1.0), high_freq_factor=params.get("high_freq_factor", 4.0),
        original_max_position_embeddings=params.get("original_max_position_embeddings"),
    )
    assert torch.equal(inverse_frequencies(rope, 32), expected)
