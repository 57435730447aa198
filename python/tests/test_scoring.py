"""Classifiers in the worker (cross-encoders and a Qwen3-Reranker served
through --hf-overrides): what Ready.pooling says of them, and their logits
through real Steps against the model's own libraries on the same
random-weight directories (random_embedders.py make_scorer)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from baton_worker.model.config import ConfigError
from baton_worker.model.pooling import overridden_architecture, pair_separator, read_classifier_config, resolve_runner
from baton_worker.runtime.loading import load_worker
from baton_worker.runtime.options import WorkerOptions, parse_options

from random_embedders import QWEN3_RERANKER_OVERRIDES, make_scorer, reference_scores
from test_pooling import QWEN_TOKENIZER, Steps

PAIRS = [
    ["the cat sat on the mat", "a dog is a model of the world"],
    ["hello", "hello world"],
    ["what is an embedding model", "the cat"],
    ["dog", "the dog sat on the mat and the cat sat on the dog"],
]


@pytest.fixture(scope="module")
def scorers(tmp_path_factory):
    root = tmp_path_factory.mktemp("scorers")
    built = {}

    def get(kind: str) -> Path:
        if kind not in built:
            built[kind] = make_scorer(kind, root / kind, QWEN_TOKENIZER if kind.startswith("qwen3") else None)
        return built[kind]

    return get


def _pair_tokens(model_dir: Path, pairs: list[list[str]]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return [tokenizer(a, b)["input_ids"] for a, b in pairs]


@pytest.mark.parametrize("kind", ["bert-cross", "xlm-roberta-cross", "qwen3-reranker"])
def test_one_step_of_pairs_equals_the_reference(scorers, kind):
    model_dir = scorers(kind)
    overrides = QWEN3_RERANKER_OVERRIDES if kind == "qwen3-reranker" else None
    opts = WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=4, num_blocks=256, dtype="float32", hf_overrides=overrides)
    loaded = load_worker(opts)
    info = loaded.ready.pooling
    assert (info.task, info.activation, info.dimensions, info.normalize) == ("classify", "sigmoid", 1, False)
    assert info.pooling_type == ("last" if kind == "qwen3-reranker" else "cls")
    if overrides:
        assert loaded.ready.architecture == "Qwen3ForSequenceClassification"
    prompts = _pair_tokens(model_dir, PAIRS)
    result = Steps(loaded.graph_runner).run([(i + 1, p, 0, len(p), True) for i, p in enumerate(prompts)])
    logits = np.asarray(result.pooled, np.float32)
    assert logits.shape == (len(PAIRS),)
    # The activation is the frontend's; here the logits go through the same sigmoid.
    np.testing.assert_allclose(1 / (1 + np.exp(-logits.astype(np.float64))), reference_scores(model_dir, PAIRS), atol=1e-5, rtol=0)


def test_pair_separator_reads_the_pair_template(scorers):
    assert pair_separator(scorers("bert-cross")) == 3  # [SEP]: B is token type 1 after it
    assert pair_separator(scorers("xlm-roberta-cross")) is None  # every token type 0


def test_classifier_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"id2label": {"0": "LABEL_0"}}))
    assert read_classifier_config(tmp_path, "cls").activation == "sigmoid"
    path.write_text(json.dumps({"id2label": {"0": "LABEL_0"}, "sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}}))
    assert read_classifier_config(tmp_path, "cls").activation == "identity"
    path.write_text(json.dumps({"id2label": {"0": "LABEL_0"}, "sbert_ce_default_activation_function": "torch.nn.modules.activation.Tanh"}))
    with pytest.raises(ConfigError, match="Tanh"):
        read_classifier_config(tmp_path, "cls")
    path.write_text(json.dumps({"id2label": {"0": "a", "1": "b", "2": "c"}}))
    with pytest.raises(ConfigError, match="3 labels"):
        read_classifier_config(tmp_path, "cls")


def test_hf_overrides(tmp_path):
    assert overridden_architecture("Qwen3ForCausalLM", QWEN3_RERANKER_OVERRIDES) == "Qwen3ForSequenceClassification"
    assert overridden_architecture("Qwen3ForCausalLM", {}) == "Qwen3ForCausalLM"
    with pytest.raises(ConfigError, match="rope_theta not supported"):
        overridden_architecture("Qwen3ForCausalLM", {"rope_theta": 1})
    with pytest.raises(ConfigError, match="is_original_qwen3_reranker true"):
        overridden_architecture("Qwen3ForCausalLM", {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"]})
    assert resolve_runner("auto", tmp_path, "Qwen3ForSequenceClassification") == "pooling"
    assert resolve_runner("auto", tmp_path, "BertForSequenceClassification") == "pooling"
    with pytest.raises(ConfigError, match="generates no text"):
        resolve_runner("generate", tmp_path, "Qwen3ForSequenceClassification")
    opts = parse_options(["--model", "m", "--in-endpoint", "a", "--out-endpoint", "b", "--block-size", "4", "--hf-overrides", json.dumps(QWEN3_RERANKER_OVERRIDES)])
    assert opts.hf_overrides == QWEN3_RERANKER_OVERRIDES
