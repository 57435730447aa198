"""The demo TTS plain-PyTorch reference: deterministic, seed-dependent, and the tokens Baton's worker samples."""

from __future__ import annotations

import pytest
import torch

from baton_worker.runtime.loading import load_worker
from baton_worker.models.demo_tts.build import build
from baton_worker.models.demo_tts.reference import Reference, sample_token
from baton_worker.models.demo_tts.text import prompt_ids
from baton_worker.runtime.options import WorkerOptions
from baton_worker.sampling.sampler import seeded_uniform
from baton_worker.protocol import SamplingParams
from engine_sim import EngineSim, SimRequest

TEXT = "Hello from Baton."
STOPPING_SEED = 216  # with TEXT and "nova", seeded T=1 sampling ends by end-of-audio after 63 tokens


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return Reference(build(tmp_path_factory.mktemp("demo-tts")))


def test_seeded_reference_is_deterministic_and_depends_on_the_seed(ref):
    a = ref.speech(TEXT, "nova", seed=7, temperature=1.0, max_tokens=48)
    b = ref.speech(TEXT, "nova", seed=7, temperature=1.0, max_tokens=48)
    c = ref.speech(TEXT, "nova", seed=8, temperature=1.0, max_tokens=48)
    assert (a.tokens, a.pcm, a.chunk_bytes) == (b.tokens, b.pcm, b.chunk_bytes)
    assert a.tokens != c.tokens and a.pcm != c.pcm
    assert a.finish_reason == "length" and len(a.tokens) == 48
    assert len(a.pcm) == 48 // 4 * 480 * 2


def test_the_voice_is_part_of_the_prompt(ref):
    a = ref.speech(TEXT, "nova", seed=7, max_tokens=24)
    b = ref.speech(TEXT, "onyx", seed=7, max_tokens=24)
    assert a.prompt_ids[1] != b.prompt_ids[1] and a.tokens != b.tokens
    with pytest.raises(ValueError, match="unknown voice 'robot'"):
        ref.speech(TEXT, "robot", seed=7, max_tokens=4)


def test_end_of_audio_stops_and_is_not_audio(ref):
    spec = ref.spec
    result = ref.speech(TEXT, "nova", seed=STOPPING_SEED, temperature=1.0, max_tokens=200)
    assert result.finish_reason == "stop" and result.tokens[-1] == spec.tokens.end_of_audio
    assert spec.tokens.end_of_audio not in result.tokens[:-1]
    frames = result.frames(spec)
    assert len(frames) == (len(result.tokens) - 1) // 4  # a trailing partial frame is dropped
    assert len(result.pcm) == len(frames) * 480 * 2 == sum(result.chunk_bytes)
    # 63 items with window 16 / stride 4: 12 full windows (4 frames, then 1 each) and an empty-handed final tail.
    assert result.chunk_bytes == [4 * 960] + [960] * 11 + [0]


def test_greedy_reference_equals_a_simple_full_forward_loop(ref):
    result = ref.speech(TEXT, "echo", temperature=0.0, max_tokens=24)
    ids = list(result.prompt_ids)
    with torch.inference_mode():
        for _ in range(24):
            token = int(ref.llm(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(token)
            if token == ref.spec.tokens.end_of_audio:
                break
    assert result.tokens == ids[len(result.prompt_ids) :]
    assert len(set(result.tokens)) > 8  # a varied stream, not one repeated code


def test_sample_token_is_the_inverse_cdf_draw():
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0])
    assert sample_token(logits, 0.0, None, 0) == 2
    with pytest.raises(ValueError, match="seed"):
        sample_token(logits, 1.0, None, 0)
    cdf = torch.cumsum(torch.softmax(logits / 0.7, dim=-1), dim=0)
    drawn = []
    for position in range(12):
        u = seeded_uniform(11, position)
        drawn.append(sample_token(logits, 0.7, 11, position))
        assert drawn[-1] == int((cdf <= u * float(cdf[-1])).sum())
    assert len(set(drawn)) > 1


@pytest.mark.parametrize("temperature,seed", [(0.0, None), (1.0, 7), (1.0, STOPPING_SEED), (0.8, 123)])
def test_reference_tokens_are_what_the_baton_worker_samples(ref, temperature, seed):
    spec = ref.spec
    result = ref.speech(TEXT, "nova", seed=seed, temperature=temperature, max_tokens=80)
    opts = WorkerOptions(model=str(ref.model_dir / spec.llm_dir), in_endpoint="", out_endpoint="", block_size=8, num_blocks=64)
    loaded = load_worker(opts)
    request = SimRequest(0, result.prompt_ids, 80, SamplingParams(temperature=temperature, seed=seed))
    EngineSim(loaded.runner, 8, 64, token_budget=16).run([request])
    # The simulated engine does not stop at end-of-audio: the reference is a prefix of what it sampled.
    assert request.output[: len(result.tokens)] == result.tokens
