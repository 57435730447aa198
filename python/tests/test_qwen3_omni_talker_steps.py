"""Qwen3-Omni's talker served as a kv_cache node (baton_worker.models.qwen3_omni.talker_steps) with its
talker_prompt node (talker_prompt_node), against transformers' Qwen3OmniMoeForConditionalGeneration.generate
(return_audio, greedy thinker and talker) on the tiny random directory, float32 on CPU:

- talker_prompt_node: for text chats, talker_prompt_ids(prompt) is generate's talker_input_ids; the node's
  talker_embeds are generate's talker prompt rows (to 1e-6), its trailing text rows and <tts_pad> row (to
  the bit), and hold Q + S + 1 rows; the thinker's eos masks later rows as generate masks them; bad inputs
  (no generated token, multimodal positions without hidden rows, an unknown voice) fail their pass;
- the talker's StepRunner, loaded through the worker's loader with talker_decoder_layout (its logits rules
  and TalkerFrames; steps never overlap) and driven with real protocol Steps (each encoded and decoded):
  four requests (three chats, and one of them again capped by max tokens) join at different steps, prefill in small
  chunks beside other rows' decodes on shuffled blocks; one is preempted mid-generation and one mid-prompt,
  both re-added later with their outputs so far. Every request's frames (StepResult.frames) are generate's
  greedy codes (what it hands code2wav) frame for frame, each token its frame's codebook 0, ending with the
  all-codec_eos stop frame on the codec_eos token; the capped one's frames are generate's with
  talker_max_new_tokens one more. Without the logits rules the codes differ. The worker keeps a request's
  frames across removal until it is released;
- the frame hook's codec sums are the code predictor's to the bit; its top-k / top-p filter is transformers'
  warpers'; a seeded sampled request gives the same frames alone and beside others, preempted or not."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.qwen3_omni_moe")

from baton_worker.graph.node_runner import PassInfo, TensorStore  # noqa: E402
from baton_worker.models.qwen3_omni import build  # noqa: E402
from baton_worker.models.qwen3_omni.talker_prompt_node import (  # noqa: E402
    GENERATED_IDS,
    MM_HIDDEN,
    OUTPUT,
    PROMPT_IDS,
    load_talker_prompt_node,
    talker_prompt_ids,
)
from baton_worker.models.qwen3_omni.talker_steps import TalkerFrames, codec_sum, talker_decoder_layout, top_k_top_p  # noqa: E402
from baton_worker.protocol import AddedRequest, ProtocolError, SamplingParams, Step  # noqa: E402
from baton_worker.runtime.loading import _load_decoder  # noqa: E402
from baton_worker.runtime.options import WorkerOptions  # noqa: E402
from frame_driver import FrameDriver, FrameRequest, i32  # noqa: E402
from qwen3_omni_fixtures import OMNI_MARKS, hf, model_dir, processor  # noqa: E402,F401  (fixtures)

pytestmark = OMNI_MARKS

G = build.NUM_CODE_GROUPS
EOS = build.CODEC_EOS_ID
BLOCK = 4
NUM_BLOCKS = 128
GREEDY = SamplingParams(temperature=0.0)
WALK = "talker_prompt"
SYSTEM = {"role": "system", "content": [{"type": "text", "text": "You are a helpful assistant."}]}


def user(text: str) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


# name -> (messages, thinker_max_new_tokens, talker_max_new_tokens)
CHATS = {
    "two_turns": ([SYSTEM, user("Hi there."), {"role": "assistant", "content": [{"type": "text", "text": "Hello! How can I help?"}]},
                   user("Say hello to the world please.")], 12, 40),
    "count": ([SYSTEM, user("Count to three.")], 10, 40),
    "short": ([user("Why?")], 5, 40),
    "capped": ([SYSTEM, user("Count to three.")], 10, 6),  # the talker stopped by talker_max_new_tokens
}


@dataclass
class Reference:
    prompt: torch.Tensor  # the thinker's prompt ids [P]
    sequence: torch.Tensor  # prompt and generated [P + T]
    talker: dict  # the talker.generate kwargs generate built
    codes: torch.Tensor  # [frames, G]: what generate handed code2wav


def transformers_speech(hf, processor, messages, thinker_tokens: int, talker_tokens: int) -> Reference:
    inputs = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt")
    seen = {}
    with pytest.MonkeyPatch.context() as mp:
        for key, module, name, keep in (("talker", hf.talker, "generate", lambda a, k, out: k),
                                        ("codes", hf.code2wav, "chunked_decode", lambda a, k, out: a[0][0])):
            inner = getattr(module, name)

            def call(*args, _inner=inner, _key=key, _keep=keep, **kwargs):
                out = _inner(*args, **kwargs)
                seen[_key] = _keep(args, kwargs, out)
                return out
            mp.setattr(module, name, functools.wraps(inner)(call))
        with torch.no_grad():
            sequence, _ = hf.generate(**inputs, return_audio=True, speaker="Ethan", thinker_do_sample=False, talker_do_sample=False,
                                      thinker_max_new_tokens=thinker_tokens, talker_max_new_tokens=talker_tokens)
    return Reference(inputs["input_ids"][0], sequence[0], seen["talker"], seen["codes"].T.contiguous())


@pytest.fixture(scope="module")
def references(hf, processor) -> dict[str, Reference]:
    return {name: transformers_speech(hf, processor, *chat) for name, chat in CHATS.items()}


@pytest.fixture(scope="module")
def prompt_node(model_dir: Path):
    return load_talker_prompt_node(model_dir)


def node_pass(node, prompt, generated, kwargs=None, mm_hidden=None) -> torch.Tensor:
    info = PassInfo(1, 1, WALK, "talker_prompt", {}, {}, kwargs or {})
    inputs = {PROMPT_IDS: [prompt], GENERATED_IDS: [generated]}
    if mm_hidden is not None:
        inputs[MM_HIDDEN] = [mm_hidden]
    prepared = node.prepare_inputs(WALK, info, inputs)
    (out,) = node(WALK, [info], node.preprocess(WALK, [info], [prepared]))
    assert set(out) == {OUTPUT} and len(out[OUTPUT]) == 1
    return out[OUTPUT][0]


def embeds_of(node, ref: Reference) -> torch.Tensor:
    p = len(ref.prompt)
    return node_pass(node, ref.prompt, ref.sequence[p:], {"voice": "Ethan"})


def test_talker_prompt_node_builds_generates_rows(prompt_node, references):
    for name, ref in references.items():
        q_ids = talker_prompt_ids(ref.prompt, prompt_node.ids)
        assert torch.equal(q_ids, ref.talker["talker_input_ids"][0]), name
        q = len(q_ids)
        embeds = embeds_of(prompt_node, ref)
        trailing = ref.talker["trailing_text_hidden"][0]
        pad = ref.talker["tts_pad_embed"][0, 0]
        assert embeds.shape == (q + trailing.shape[0] + 1, build.TALKER_HIDDEN) and embeds.dtype == torch.float32, name
        torch.testing.assert_close(embeds[:q], ref.talker["inputs_embeds"][0], rtol=0, atol=1e-6)
        # One projection call over generate's rows: its bits.
        assert torch.equal(embeds[q:-1], trailing), name
        assert torch.equal(embeds[-1], pad), name
        # The random thinker runs to its max tokens here: one text row per generated token but the first and the last.
        assert trailing.shape[0] == len(ref.sequence) - len(ref.prompt) - 1


def test_talker_prompt_node_masks_after_the_thinker_eos_and_checks_its_inputs(prompt_node, references):
    ref = references["count"]
    ids = prompt_node.ids
    p = len(ref.prompt)
    generated = ref.sequence[p:].clone()
    plain = node_pass(prompt_node, ref.prompt, generated)
    q = len(talker_prompt_ids(ref.prompt, ids))
    bos, eod, pad = prompt_node.tts_rows
    # A thinker eos as generated token 3: step 3 takes <tts_text_eod>, later steps <tts_pad>, as generate masks them.
    generated[3] = build.IM_END_ID
    masked = node_pass(prompt_node, ref.prompt, generated)
    assert masked.shape == plain.shape
    assert torch.equal(masked[: q + 2], plain[: q + 2])  # step 2 is generated token 3's row (the eos's own embedding)
    assert not torch.equal(masked[q + 2], plain[q + 2])
    assert torch.equal(masked[q + 3], eod) and all(torch.equal(r, pad) for r in masked[q + 4 :])
    # Stopped on its eos (the last token): nothing masked; one generated token: step 0 takes <tts_text_eod>.
    stopped = torch.cat((ref.sequence[p:p + 4], torch.tensor([build.IM_END_ID])))
    out = node_pass(prompt_node, ref.prompt, stopped)
    assert out.shape[0] == q + 4 + 1 and torch.equal(out[q + 3], eod)
    one = node_pass(prompt_node, ref.prompt, ref.sequence[p:p + 1])
    assert one.shape[0] == q + 2 and torch.equal(one[q], eod) and torch.equal(one[q + 1], pad)
    # The voice: any case, "ethan" by default; another speaker's prompt rows differ.
    assert torch.equal(node_pass(prompt_node, ref.prompt, generated, {"voice": "ETHAN"}), masked)
    assert not torch.equal(node_pass(prompt_node, ref.prompt, generated, {"voice": "chelsie"})[:q], masked[:q])

    info = PassInfo(1, 1, WALK, "talker_prompt", {}, {}, {"voice": "nobody"})
    with pytest.raises(ValueError, match="unknown speaker 'nobody'"):
        prompt_node.prepare_inputs(WALK, info, {PROMPT_IDS: [ref.prompt], GENERATED_IDS: [generated]})
    info = PassInfo(1, 1, WALK, "talker_prompt", {}, {}, {})
    with pytest.raises(ValueError, match="generated no token"):
        prompt_node.prepare_inputs(WALK, info, {PROMPT_IDS: [ref.prompt], GENERATED_IDS: []})
    audio = torch.cat((ref.prompt[:3], torch.tensor([build.AUDIO_TOKEN_ID] * 2), ref.prompt[3:]))
    with pytest.raises(ValueError, match="2 audio / image / video positions"):
        prompt_node.prepare_inputs(WALK, info, {PROMPT_IDS: [audio], GENERATED_IDS: [generated]})
    with pytest.raises(ValueError, match="float"):
        prompt_node.prepare_inputs(WALK, info, {PROMPT_IDS: [ref.prompt.float()], GENERATED_IDS: [generated]})


# --- the talker's StepRunner ---


def load_runner(model_dir: Path):
    """The talker's decoder, KV cache and StepRunner as the worker's loader makes them for the node's layout,
    with a tensor store for AddedRequest.embeds (the graph worker's)."""
    opts = WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=BLOCK, num_blocks=NUM_BLOCKS,
                         dtype="float32", device="cpu")
    decoder = _load_decoder(opts, model_dir, torch.device("cpu"), "cpu", True, layout=talker_decoder_layout(model_dir))
    runner = decoder.runner
    store = TensorStore()
    runner.embeds_of = store.get
    return runner, store


def Request(req_id: int, ids: list[int], handle: int, chunk: int, max_frames: int = 40, sampling: SamplingParams = GREEDY) -> FrameRequest:
    """A talker request: its talker_prompt_ids and its talker_embeds' handle."""
    return FrameRequest(req_id, ids, handle, chunk, max_frames, sampling)


def _talker_stop(token: int, frame: list[int]) -> bool:
    assert token == frame[0], f"token {token} for frame {frame}"
    return token == EOS


class Driver(FrameDriver):
    """The frame driver over the talker's StepRunner; it stops a request on codec_eos or at its max frames."""

    def __init__(self, runner, seed: int = 0):
        super().__init__(runner.execute, G, _talker_stop, NUM_BLOCKS, BLOCK, seed)
        self.runner = runner


def run(driver: Driver, requests: dict[int, Request], joins: dict[int, int], preempt: dict[int, tuple[int, int]] | None = None,
        released: dict[int, int] | None = None) -> None:
    """Requests join at their step; preempt: req_id -> (its computed positions or frames at which it is removed, the steps
    it stays out). A frame count counts once the request has that many frames; a negative value: that many prompt positions."""
    preempt = dict(preempt or {})
    back: dict[int, int] = {}
    s = 0
    while len(driver.running) + len(driver.added) or back or any(at >= s for at in joins.values()):
        for i, at in list(joins.items()):
            if at == s:
                driver.add(requests[i])
        for i, at in list(back.items()):
            if at == s:
                del back[i]
                driver.add(requests[i])
        driver.step()
        for i, (when, out) in list(preempt.items()):
            r = requests[i]
            hit = (when < 0 and 0 < r.computed and r.computed >= -when and not r.tokens) or (when > 0 and len(r.frames) >= when)
            if hit and r in driver.running and not r.done:
                del preempt[i]
                driver.remove(r)
                back[i] = s + 1 + out
                if released is not None:
                    # While out of its slot the worker still holds its frames.
                    released[i] = len(driver.runner.frames.generated.get(i, ()))
        s += 1
        assert s < 400
    driver.step()  # the last removals


@pytest.fixture(scope="module")
def served(model_dir: Path, prompt_node, references):
    runner, store = load_runner(model_dir)
    requests = {}
    for i, (name, chunk) in enumerate((("two_turns", 3), ("count", 5), ("short", 2), ("capped", 4)), start=1):
        ref = references[name]
        handle = store.put(embeds_of(prompt_node, ref)).handle
        max_tokens = CHATS[name][2] - 1 if name == "capped" else 40
        requests[i] = Request(i, talker_prompt_ids(ref.prompt, prompt_node.ids).tolist(), handle, chunk, max_tokens)
    driver = Driver(runner, seed=1)
    held: dict[int, int] = {}
    # Request 2 is preempted after its fourth frame, request 3 after 4 prompt positions.
    run(driver, requests, joins={1: 0, 2: 0, 3: 2, 4: 5}, preempt={2: (4, 2), 3: (-4, 1)}, released=held)
    return runner, store, requests, driver, held


def test_the_layout_loads_a_frame_model_with_the_rules(served):
    runner, *_ = served
    assert isinstance(runner.frames, TalkerFrames) and runner.frames.width == G and runner.frames.stop_token_id == EOS
    assert runner.logits_rules is not None
    assert not runner.overlap, "the logits rules and the frames read the tokens on the host"


def test_greedy_steps_equal_transformers(served, references):
    runner, store, requests, driver, held = served
    names = {1: "two_turns", 2: "count", 3: "short", 4: "capped"}
    assert driver.steps_with_prefill_and_decode > 0, "prompt chunks ran beside other rows' decodes"
    assert held == {2: 4, 3: 0}  # request 2's four frames were kept while it was out; request 3 had none
    for i, r in requests.items():
        expected = references[names[i]].codes
        if names[i] == "capped":
            # generate drew talker_max_new_tokens codebooks and made frames of all but the last; max_tokens one fewer.
            assert len(r.frames) == r.max_frames == expected.shape[0] and EOS not in r.tokens
            assert torch.equal(torch.tensor(r.frames), expected)
            continue
        assert r.tokens[-1] == EOS and r.frames[-1] == [EOS] * G, f"request {i} ends with the stop frame"
        got = torch.tensor(r.frames[:-1])
        assert got.shape == expected.shape and torch.equal(got, expected), f"request {i}: ours {got.tolist()}\ntransformers {expected.tolist()}"
        assert EOS not in r.tokens[:-1]
    # The worker keeps finished requests' frames until released (GraphWork.finished_requests).
    frames = runner.frames
    assert sorted(frames.generated) == [1, 2, 3, 4] and not frames.slots
    for i in requests:
        frames.release(i)
    assert not frames.generated and not frames.ended


def test_without_the_rules_the_codes_differ(model_dir, prompt_node, references):
    runner, store = load_runner(model_dir)
    runner.logits_rules = None
    ref = references["two_turns"]
    r = Request(1, talker_prompt_ids(ref.prompt, prompt_node.ids).tolist(), store.put(embeds_of(prompt_node, ref)).handle, 8)
    run(Driver(runner), {1: r}, joins={1: 0})
    got = torch.tensor([f for f in r.frames if f[0] != EOS])
    assert got.shape != ref.codes.shape or not torch.equal(got, ref.codes)


def test_bad_embeds_are_refused(model_dir, prompt_node, references):
    runner, store = load_runner(model_dir)
    ref = references["short"]
    ids = talker_prompt_ids(ref.prompt, prompt_node.ids)
    q = len(ids)
    good = embeds_of(prompt_node, ref)
    cases = {
        "none": (-1, "none were given"),
        "short": (store.put(good[:q]).handle, rf"talker_embeds must be float \[>= {q + 1}, {build.TALKER_HIDDEN}\]"),
        "ints": (store.put(good.long()).handle, "talker_embeds must be float"),
        "unknown": (999, "not in this worker's store"),
    }
    for what, (handle, message) in cases.items():
        added = AddedRequest(1, ids.numpy().astype(np.int32), q, GREEDY, embeds=handle)
        with pytest.raises(ProtocolError, match=message) as error:
            runner.execute(Step(0, [added], i32(), i32(), i32(), i32(), i32(), i32(), np.zeros(0, np.uint8)))
        assert error.value.field == "Step.added[0].embeds", what
    # More outputs than this worker generated frames for.
    added = AddedRequest(1, np.concatenate((ids.numpy(), [5])).astype(np.int32), q, GREEDY, embeds=store.put(good).handle)
    with pytest.raises(ProtocolError, match="1 output positions but this worker generated 0 frames"):
        runner.execute(Step(0, [added], i32(), i32(), i32(), i32(), i32(), i32(), np.zeros(0, np.uint8)))


def test_codec_sums_are_the_code_predictors(served):
    runner, *_ = served
    talker = runner.model
    g = torch.Generator().manual_seed(3)
    h = torch.randn(7, build.TALKER_HIDDEN, generator=g)
    c0 = torch.randint(0, build.CODEBOOK_SIZE, (7,), generator=g)
    codes, codec = talker.code_predictor.frames(h, c0)
    assert torch.equal(codec_sum(talker, codes), codec)
    assert torch.equal(codec_sum(talker, codes[2:5]), codec[2:5])


def test_top_k_top_p_is_transformers_warpers():
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, build.CODEBOOK_SIZE, generator=g) * 3
    logits[0, :3] = 40.0  # a row whose top-p keeps few ids
    expected = TopPLogitsWarper(0.8)(None, TopKLogitsWarper(50)(None, logits.clone()))
    assert torch.equal(top_k_top_p(logits, 50, 0.8), expected)


def test_a_seeded_sampled_request_repeats(model_dir, prompt_node, references):
    ref = references["count"]
    ids = talker_prompt_ids(ref.prompt, prompt_node.ids).tolist()

    def speak(with_other: bool, preempt: bool, seed: int = 11) -> list[list[int]]:
        runner, store = load_runner(model_dir)
        handle = store.put(embeds_of(prompt_node, ref)).handle
        requests = {1: Request(1, ids, handle, 4, 12, SamplingParams(temperature=0.9, top_k=50, seed=seed))}
        if with_other:
            requests[2] = Request(2, ids, handle, 3, 12, SamplingParams(temperature=0.9, top_k=50, seed=5))
        run(Driver(runner), requests, joins={i: 0 for i in requests}, preempt={1: (3, 1)} if preempt else None)
        return requests[1].frames

    alone = speak(False, False)
    assert alone == speak(True, True)
    assert alone != speak(False, False, seed=12)
    assert torch.tensor(alone)[:, 1:].unique().numel() > 3  # the code predictor sampled too
