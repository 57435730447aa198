"""Qwen3-Omni's talker pieces (baton_worker.models.qwen3_omni.talker) against transformers'
Qwen3OmniMoeForConditionalGeneration.generate on the tiny random directory (float32, CPU):

- speech for a two-turn text chat, an audio question and an image question (greedy thinker and
  talker): transformers' generate runs with its thinker result, its talker inputs (prompt, text
  rows, every decode step's input row) and its code2wav input recorded; then the talker prompt is
  rebuilt from the thinker's prompt, the thinker's embedding table and (audio, image) its hidden
  rows at accept_hidden_layer, and a plain loop runs the talker through the paged KV cache
  (prefill in two chunks, then one step per frame: codec logits -> the logits rules -> argmax ->
  the code predictor -> codec sum + the step's text row). The prompt ids and positions equal
  generate's, the prompt rows too (here to the bit), every step's text row to rounding, every
  codec sum to the bit, and the codes equal its codes, every group of every frame, ending where it
  ends: on codec_eos, and at talker_max_new_tokens (whose draw has no frame). Without the rules,
  or with running positions for the image prompt, the codes differ: both are exercised;
- the code predictor over many rows at once gives each row's frame and codec sum as alone;
- the logits rules equal transformers' repetition penalty and suppression on random logits;
- trailing_text_id follows generate's rows (its quirks included) and, fed a growing thinker
  sequence, answers only once its answer is final, at the dependency its docstring states."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.qwen3_omni_moe")

from baton_worker.attention import AttentionMetadata, make_backend  # noqa: E402
from baton_worker.attention.kv_cache import KVCache  # noqa: E402
from baton_worker.model.weights import WeightReader  # noqa: E402
from baton_worker.models.qwen3_omni import build  # noqa: E402
from baton_worker.models.qwen3_omni.talker import (  # noqa: E402
    THINKER_TABLE,
    TalkerLogitsRules,
    load_talker,
    talker_positions,
    talker_prompt,
    trailing_text_id,
)
from qwen3_omni_fixtures import OMNI_MARKS, hf, model_dir, processor  # noqa: E402,F401  (fixtures)

pytestmark = OMNI_MARKS

BLOCK = 4
TALKER_MAX = 20


@pytest.fixture(scope="module")
def talker(model_dir: Path):
    return load_talker(model_dir)


@pytest.fixture(scope="module")
def rules(model_dir: Path) -> TalkerLogitsRules:
    return TalkerLogitsRules.from_dir(model_dir)


@pytest.fixture(scope="module")
def thinker_table(model_dir: Path) -> torch.Tensor:
    return WeightReader(model_dir, torch.float32, torch.device("cpu")).get(THINKER_TABLE)


def chat(processor, content: list[dict]) -> dict:
    messages = [{"role": "system", "content": [{"type": "text", "text": "You are a helpful assistant."}]},
                {"role": "user", "content": content}]
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                         return_tensors="pt")


def transformers_speech(hf, inputs: dict, thinker_tokens: int, talker_tokens: int, monkeypatch) -> dict:
    """generate's output sequence, and what its thinker returned, its talker got and its code2wav got."""
    seen = {}

    def recording(key: str, module, name: str, keep):
        inner = getattr(module, name)

        def call(*args, **kwargs):
            out = inner(*args, **kwargs)
            seen[key] = keep(args, kwargs, out)
            return out
        monkeypatch.setattr(module, name, call)

    recording("thinker", hf.thinker, "generate", lambda args, kwargs, out: out)
    recording("talker", hf.talker, "generate", lambda args, kwargs, out: kwargs)
    recording("codes", hf.code2wav, "chunked_decode", lambda args, kwargs, out: args[0][0])  # [groups, frames]
    steps = seen["steps"] = []  # the talker's decode inputs, one row each
    forward = hf.talker.forward

    @functools.wraps(forward)  # generate reads the signature
    def talker_forward(*args, **kwargs):
        embeds = kwargs.get("inputs_embeds")
        if embeds is not None and embeds.shape[1] == 1:
            steps.append(embeds[0, 0].clone())
        return forward(*args, **kwargs)
    monkeypatch.setattr(hf.talker, "forward", talker_forward)
    with torch.no_grad():
        sequence, _ = hf.generate(**inputs, return_audio=True, speaker="Ethan", thinker_do_sample=False,
                                  talker_do_sample=False, thinker_max_new_tokens=thinker_tokens,
                                  talker_max_new_tokens=talker_tokens)
    return {"sequence": sequence[0], **seen}


class Spoken:
    """What one run of the loop produced, step by step."""

    def __init__(self):
        self.h, self.c0, self.frames, self.codec = [], [], [], []

    @property
    def codes(self) -> torch.Tensor:
        """[groups, frames], as generate hands them to code2wav."""
        return torch.stack(self.frames, dim=1)


def speak(talker, rules, rows: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor | None, text_row,
          max_new_tokens: int = TALKER_MAX) -> Spoken:
    """The plain loop: the talker's prefill in two chunks over the paged cache, then per step codec logits ->
    rules -> argmax; it stops on codec_eos or at max_new_tokens draws (generate makes no frame for either
    draw); otherwise the code predictor's frame, and its codec sum plus text_row(j) is the next input."""
    c = talker.config
    q = rows.shape[0]
    num_blocks = -(-(q + max_new_tokens) // BLOCK)
    cache = KVCache(c, num_blocks, BLOCK, torch.float32, torch.device("cpu"))
    backend = make_backend("cpu", cache, c.num_heads, talker.scale, c.sliding_windows)
    table = torch.arange(num_blocks, dtype=torch.int64)[None]

    def forward(start: int, end: int, step_ids, step_positions, step_rows) -> torch.Tensor:
        meta = AttentionMetadata(torch.arange(start, end), np.array([0, end - start]), np.array([end]), table, BLOCK)
        hidden = talker.hidden_states(step_ids, step_positions, backend.prepare(meta), replace=(torch.arange(end - start), step_rows))
        return talker.head_input(hidden, torch.tensor([end - start - 1]))

    def prompt_positions(start: int, end: int) -> torch.Tensor:
        return torch.arange(start, end) if positions is None else positions[:, start:end]

    cut = q // 2
    forward(0, cut, ids[:cut], prompt_positions(0, cut), rows[:cut])
    h = forward(cut, q, ids[cut:], prompt_positions(cut, q), rows[cut:])
    next_position = q if positions is None else int(positions.max()) + 1
    out = Spoken()
    generated: list[int] = []
    while True:
        logits = talker.codebook0_logits(h)
        if rules is not None:
            logits = rules.apply(logits, [(ids.tolist() + generated, q)])
        c0 = logits.argmax(dim=-1)
        generated.append(int(c0))
        if int(c0) == talker.ids.codec_eos or len(generated) == max_new_tokens:
            return out
        codes, codec = talker.code_predictor.frames(h, c0)
        j = len(out.frames)
        out.h.append(h)
        out.c0.append(c0)
        out.frames.append(codes[0])
        out.codec.append(codec)
        h = forward(q + j, q + j + 1, c0, torch.tensor([next_position + j]), codec + text_row(j))


@dataclass
class Prompt:
    """Our talker inputs for one request, built from the thinker's outputs."""

    rows: torch.Tensor
    ids: torch.Tensor
    positions: torch.Tensor | None
    text_row: object  # step -> its text row [1, hidden]


def check_speech(hf, talker, rules, thinker_table, inputs: dict, thinker_tokens: int, monkeypatch, images=None,
                 talker_tokens: int = TALKER_MAX) -> tuple[Spoken, Prompt]:
    """transformers' speech for `inputs`, and ours from its thinker's outputs: the same talker inputs and codes."""
    theirs = transformers_speech(hf, inputs, thinker_tokens, talker_tokens, monkeypatch)
    thinker, talker_kwargs, expected, sequence = theirs["thinker"], theirs["talker"], theirs["codes"], theirs["sequence"]
    p = inputs["input_ids"].shape[1]
    ids = talker.ids

    # The thinker's side: its embedding rows of the prompt and first token, its layer-k rows at audio/image tokens.
    embeds = thinker_table[sequence[: p + 1]]
    prefill = thinker.hidden_states[0]
    mm = torch.isin(sequence[:p], torch.tensor(ids.multimodal))
    assert torch.equal(embeds[:p][~mm], prefill[0][0, :p][~mm])  # generate's thinker_embed rows
    mm_hidden = prefill[ids.accept_hidden_layer][0, :p][mm] if mm.any() else None

    rows, talker_ids = talker_prompt(talker, sequence[:p], embeds, mm_hidden, "Ethan")
    assert torch.equal(talker_ids, talker_kwargs["talker_input_ids"][0])
    # The projections run over subsets of generate's rows, which here gives the same bits.
    torch.testing.assert_close(rows, talker_kwargs["inputs_embeds"][0], rtol=0, atol=1e-6)
    positions = talker_positions(talker_ids, images, ids)
    if images is not None:
        theirs_positions, _ = hf.talker.get_rope_index(talker_ids[None], images, None, torch.ones(1, len(talker_ids)))
        assert positions is not None and torch.equal(positions, theirs_positions[:, 0].long())

    trailing = talker_kwargs["trailing_text_hidden"][0]
    pad = talker_kwargs["tts_pad_embed"][0, 0]

    def text_row(j: int) -> torch.Tensor:
        token = trailing_text_id(sequence.tolist(), p, j, True, ids)
        row = talker.text_rows(torch.tensor([token]), thinker_table[[token]])
        # One row alone takes another matrix-vector kernel than generate's call over all of them: rounding.
        torch.testing.assert_close(row[0], trailing[j] if j < trailing.shape[0] else pad, rtol=0, atol=1e-4)
        return row

    prompt = Prompt(rows, talker_ids, positions, text_row)
    spoken = speak(talker, rules, rows, talker_ids, positions, text_row, talker_tokens)
    got = spoken.codes
    assert got.shape[0] == build.NUM_CODE_GROUPS
    assert got.shape == expected.shape and torch.equal(got, expected), f"ours {got.tolist()}\ntransformers {expected.tolist()}"
    # The codec sums are generate's to the bit: with its text rows they make its decode inputs.
    assert len(theirs["steps"]) == len(spoken.codec)
    for j, (codec, step) in enumerate(zip(spoken.codec, theirs["steps"])):
        assert torch.equal(codec[0] + (trailing[j] if j < trailing.shape[0] else pad), step), f"step {j}"
    return spoken, prompt


def test_text_chat_speech_equals_transformers(hf, processor, talker, rules, thinker_table, monkeypatch):
    # Two user turns (both go to the talker) around an assistant turn and after a system turn (neither does).
    messages = [{"role": "system", "content": [{"type": "text", "text": "You are a helpful assistant."}]},
                {"role": "user", "content": [{"type": "text", "text": "Hi there."}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Hello! How can I help?"}]},
                {"role": "user", "content": [{"type": "text", "text": "Say hello to the world please."}]}]
    inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                                           return_tensors="pt")
    spoken, prompt = check_speech(hf, talker, rules, thinker_table, inputs, 12, monkeypatch)
    # The random directory's wiring: one frame per generated text token but the last, then codec_eos.
    assert len(spoken.frames) == 11
    # The rules decide codes here: without them the loop speaks otherwise.
    bare = speak(talker, None, prompt.rows, prompt.ids, prompt.positions, prompt.text_row)
    assert len(bare.frames) != len(spoken.frames) or not torch.equal(bare.codes, spoken.codes)
    # Stopped by talker_max_new_tokens: the last draw has no frame.
    short, _ = check_speech(hf, talker, rules, thinker_table, inputs, 12, monkeypatch, talker_tokens=5)
    assert torch.equal(short.codes, spoken.codes[:, :4])


def test_audio_question_speech_equals_transformers(hf, processor, talker, rules, thinker_table, monkeypatch):
    clip = (0.3 * np.random.RandomState(0).randn(build.AUDIO_SAMPLE_RATE)).astype(np.float32)
    inputs = chat(processor, [{"type": "audio", "audio": clip}, {"type": "text", "text": "What is this?"}])
    assert int((inputs["input_ids"] == build.AUDIO_TOKEN_ID).sum()) == 13
    spoken, prompt = check_speech(hf, talker, rules, thinker_table, inputs, 8, monkeypatch)
    assert len(spoken.frames) == 7
    assert prompt.positions is None  # audio alone: the running position, as generate gives it


def test_image_question_speech_equals_transformers(hf, processor, talker, rules, thinker_table, monkeypatch):
    from PIL import Image

    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 96, 3), dtype=np.uint8))
    inputs = chat(processor, [{"type": "image", "image": image}, {"type": "text", "text": "What is this?"}])
    grids = inputs["image_grid_thw"]
    assert int(grids[0, 1]) != int(grids[0, 2])  # a non-square grid: the h and w streams differ
    spoken, prompt = check_speech(hf, talker, rules, thinker_table, inputs, 8, monkeypatch, images=grids)
    assert len(spoken.frames) == 7
    # The image's positions decide codes here: with running positions the loop speaks otherwise.
    flat = speak(talker, rules, prompt.rows, prompt.ids, None, prompt.text_row)
    assert len(flat.frames) != len(spoken.frames) or not torch.equal(flat.codes, spoken.codes)


def test_code_predictor_batched_equals_alone(hf, processor, talker, thinker_table, rules, monkeypatch):
    inputs = chat(processor, [{"type": "text", "text": "Count to three."}])
    spoken, _ = check_speech(hf, talker, rules, thinker_table, inputs, 10, monkeypatch)
    h, c0 = torch.cat(spoken.h), torch.cat(spoken.c0)
    assert h.shape[0] >= 6
    codes, codec = talker.code_predictor.frames(h, c0)
    assert torch.equal(codes, torch.stack(spoken.frames))
    torch.testing.assert_close(codec, torch.cat(spoken.codec), rtol=0, atol=1e-5)


def test_logits_rules_equal_transformers(hf, rules):
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor, SuppressTokensLogitsProcessor

    config = hf.config.talker_config
    vocab, eos = config.text_config.vocab_size, config.codec_eos_token_id
    # generate's list, as it builds it.
    suppressed = [i for i in range(vocab - 1024, vocab) if i != eos]
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, vocab, generator=g) * 4
    histories = [[], [5, 5, 17], [eos - 3, 3, 2000, 1], torch.randint(0, 2048, (40,), generator=g).tolist(), [0]]
    prompt = [151644, 872, build.TTS_PAD_ID]  # prompt ids are not penalized
    got = rules.apply(logits, [(prompt + h, len(prompt)) for h in histories])
    for r, history in enumerate(histories):
        scores = logits[r : r + 1].clone()
        generated = torch.tensor([history], dtype=torch.int64).reshape(1, -1)
        scores = RepetitionPenaltyLogitsProcessor(penalty=1.05)(generated, scores)
        scores = SuppressTokensLogitsProcessor(suppressed)(generated, scores)
        assert torch.equal(got[r : r + 1], scores), f"row {r}"
    assert torch.isinf(got[:, eos - 1]).all() and not torch.isinf(got[:, eos]).any()


def _generate_trailing(sequence: list[int], p: int, eos_ids: tuple[int, ...], ids) -> list[int]:
    """generate's trailing rows as thinker ids (its tensor code over ids): the assistant rows a .. (the last
    token excluded), from a + 4 on, then <tts_text_eod>; eos masking; steps past them <tts_pad>."""
    a = max(i for i in range(p - 1) if sequence[i] == ids.im_start and sequence[i + 1] == ids.assistant)
    trailing = sequence[a : len(sequence) - 1][4:] + [ids.tts_eos]
    generated = sequence[p:]
    first = min([i for i, t in enumerate(generated) if t in eos_ids], default=len(generated))
    return [ids.tts_pad if j > first else ids.tts_eos if j == first else t for j, t in enumerate(trailing)]


@pytest.mark.parametrize("tail, generated, eos_ids", [
    ((), [11, 12, 13, 14, 15, build.IM_END_ID], (build.IM_END_ID,)),  # stops at its eos
    ((), [11, 12, 13, 14, 15, 16], (build.IM_END_ID,)),  # stops at max tokens: 16 is never spoken
    ((), [11, 12, 13, 14, 15, 16], (build.IM_END_ID, 14)),  # an eos id before the end masks the rest
    ((), [11, 12], (build.IM_END_ID,)),  # the shortest generate accepts
    ((21, 22), [11, 12, 13, 14], (build.IM_END_ID, 12)),  # a prompt tail after the header (a think block)
])
def test_trailing_text_ids_follow_generate(talker, tail, generated, eos_ids):
    ids = talker.ids
    prompt = [ids.im_start, ids.user, 198, 9707, ids.im_start, ids.assistant, 198, *tail]
    p = len(prompt)
    sequence = prompt + generated
    expected = _generate_trailing(sequence, p, eos_ids, ids)
    steps = len(expected) + 3
    final = [trailing_text_id(sequence, p, j, True, ids, eos_ids) for j in range(steps)]
    assert final == expected + [ids.tts_pad] * 3
    # Streaming: with the thinker still running, an answer is given only when it is the final one; without a
    # prompt tail, step j answers once generated token j + 2 exists.
    for j in range(steps):
        for n in range(len(generated) + 1):
            got = trailing_text_id(sequence[: p + n], p, j, False, ids, eos_ids)
            assert got is None or got == final[j], (j, n)
            if not tail and not set(generated[:n]) & set(eos_ids):
                assert (got is not None) == (n >= j + 3), (j, n)
