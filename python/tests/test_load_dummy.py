"""--load-format dummy: random decoder weights from the config alone. The worker
must build the same model transformers builds from those weights (names and
shapes right for every architecture variant), and a seed must name one model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from baton_worker.model.config import ConfigError, load_model_config
from baton_worker.model.weights import RandomWeightReader
from baton_worker.runtime.loading import load_worker
from baton_worker.runtime.options import WorkerOptions
from baton_worker.protocol import SamplingParams
from engine_sim import EngineSim, SimRequest
from hf_reference import hf_greedy
from random_models import make_model_dir

CASES = [("llama", 0), ("qwen2", 3), ("qwen3", 0), ("mistral", 0)]  # tied/untied, qkv bias, q/k norm, sliding window
PROMPTS = [[3, 17, 42], [7] * 11, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18]]


def _config_only(tmp_path, arch, variant):
    full = make_model_dir(arch, tmp_path / "full", variant)
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "generation_config.json"):
        if (full / name).exists():
            shutil.copy(full / name, bare / name)
    return bare


def _worker_greedy(model_dir, seed, extra=None):
    opts = WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=4, num_blocks=64, load_format="dummy", seed=seed,
                         dtype="float32", model_loader_extra_config=extra)
    loaded = load_worker(opts)
    sim = EngineSim(loaded.runner, 4, 64, token_budget=7)
    requests = [SimRequest(i, p, 8, SamplingParams(temperature=0.0), arrive_step=i) for i, p in enumerate(PROMPTS)]
    sim.run(requests)
    return [r.output for r in requests]


@pytest.mark.parametrize("arch,variant", CASES, ids=[f"{a}-v{v}" for a, v in CASES])
def test_dummy_weights_are_the_model_transformers_builds_from_them(tmp_path, arch, variant):
    import transformers

    bare = _config_only(tmp_path, arch, variant)
    assert not list(bare.glob("*.safetensors"))
    got = _worker_greedy(bare, seed=5)
    reader = RandomWeightReader(load_model_config(bare), torch.float32, torch.device("cpu"), seed=5)
    hf_config = transformers.AutoConfig.from_pretrained(str(bare))
    model = transformers.AutoModelForCausalLM.from_config(hf_config).eval()
    state = {name: reader.get(name) for name in model.state_dict() if reader.has(name)}
    missing = set(model.state_dict()) - set(state)
    # A tied head is the embedding; nothing else may be left out.
    assert missing <= ({"lm_head.weight"} if hf_config.tie_word_embeddings else set()), missing
    assert set(reader.shapes) <= set(model.state_dict()), set(reader.shapes) - set(model.state_dict())
    model.load_state_dict(state, strict=False)
    if hf_config.tie_word_embeddings:
        model.tie_weights()
    assert got == hf_greedy(None, PROMPTS, 8, model=model)


def test_a_seed_names_one_model(tmp_path):
    bare = _config_only(tmp_path, "qwen3", 0)
    first = _worker_greedy(bare, seed=1)
    assert _worker_greedy(bare, seed=1) == first
    assert _worker_greedy(bare, seed=2) != first


def test_dummy_needs_a_complete_config(tmp_path):
    # Unlike dummy-null, the shapes come from the config: a partial one is refused, naming what is missing.
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 1000}))
    opts = WorkerOptions(model=str(tmp_path), in_endpoint="", out_endpoint="", block_size=4, num_blocks=8, load_format="dummy")
    with pytest.raises(Exception, match="hidden_size"):
        load_worker(opts)


def test_residual_scale_makes_a_tied_model_repeat_its_input(tmp_path):
    """residual_scale 0.05: the layers barely move each token's embedding, so a tied model's greedy
    output repeats the prompt's last token (the copying workload of the speculative-decoding bench)."""
    bare = _config_only(tmp_path, "llama", 3)  # variant 3: tied embeddings
    config = json.loads((bare / "config.json").read_text())
    assert config["tie_word_embeddings"]
    # Wide enough that at the usual scale the layers outweigh the embedding.
    config.update(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    (bare / "config.json").write_text(json.dumps(config))
    outputs = _worker_greedy(bare, seed=5, extra={"residual_scale": 0.05})
    assert outputs == [[p[-1]] * 8 for p in PROMPTS]
    usual = _worker_greedy(bare, seed=5)
    assert all(out[0] != p[-1] for out, p in zip(usual, PROMPTS)), usual


def test_loader_extra_config_is_checked(tmp_path):
    bare = _config_only(tmp_path, "llama", 3)
    with pytest.raises(ConfigError, match=r"unknown key 'scale' \(--load-format dummy takes residual_scale\)"):
        _worker_greedy(bare, seed=1, extra={"scale": 0.1})
    with pytest.raises(ConfigError, match=r"residual_scale must be a number in \[0, 1\], got 'x'"):
        _worker_greedy(bare, seed=1, extra={"residual_scale": "x"})
    full = make_model_dir("llama", tmp_path / "weights", 3)
    opts = WorkerOptions(model=str(full), in_endpoint="", out_endpoint="", block_size=4, num_blocks=8, model_loader_extra_config={"residual_scale": 0})
    with pytest.raises(ConfigError, match="applies to --load-format dummy of a plain LLM, not --load-format auto"):
        load_worker(opts)
