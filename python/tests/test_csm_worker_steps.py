"""CSM loaded as the worker loads it (load_worker on the random CSM directory) and driven with real
protocol Steps (each one encoded and decoded, and so is its result), as the engine and the conductor
drive it:

- the exported graph: the backbone a kv_cache node taking its prompt as embeds (frames of K + 1),
  frame_width K, stopping on <|audio_eos|>; the codec stateless;
- requests (both speakers, with and without context audio sent as WAV bytes) get their prompt from
  process_prompt (GraphWork.prompts), then run greedy with small prefill chunks beside other rows'
  frame steps, joining at different steps, on shuffled block ids; one is preempted mid-generation
  (Step.removed) and re-added later with its outputs so far, recomputed in chunks, and one is
  preempted mid-prompt. Every request's frames (StepResult.frames) are transformers' greedy codes
  frame for frame, ending on the stop frame, whose token is the stop id (any other frame's: its
  codebook 0);
- the worker keeps a request's generated frames across removal until GraphWork.finished_requests;
- bad added requests are refused naming AddedRequest.embeds: none given, not in the store, the
  wrong shape or dtype, more outputs than frames this worker generated;
- a seeded sampled request (temperature 1, top-k 50) gives the same frames twice, alone or beside
  another request, preempted or not; another seed gives others;
- on a CUDA worker (skipped without one), where process_prompt's frames are stored on the GPU, steps
  mixing prompt chunks and generated frames run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from frame_driver import FrameDriver, FrameRequest, i32, wire
from csm_fixtures import CONVERSATIONS, CSM_MARKS, SAMPLE_RATE, as_decoded, wav_bytes, hf, model_dir  # noqa: F401  (fixtures)

transformers = pytest.importorskip("transformers")

from baton_worker.models.csm.build import AUDIO_EOS_TOKEN_ID, AUDIO_TOKEN_ID, NUM_CODEBOOKS  # noqa: E402
from baton_worker.models.csm.steps import CsmFrames  # noqa: E402
from baton_worker.protocol import AddedRequest, GraphWork, PromptRequest, ProtocolError, SamplingParams, Step  # noqa: E402
from baton_worker.runtime.loading import load_worker  # noqa: E402
from baton_worker.runtime.options import WorkerOptions  # noqa: E402

pytestmark = CSM_MARKS

K = NUM_CODEBOOKS
STOP = AUDIO_EOS_TOKEN_ID  # 128003, <|audio_eos|>: the backbone node's stop id
BLOCK = 4
NUM_BLOCKS = 400
MAX_FRAMES = 80
GREEDY = SamplingParams(temperature=0.0)


def load(model_dir: Path, device: str = "cpu"):
    opts = WorkerOptions(model=str(model_dir), in_endpoint="", out_endpoint="", block_size=BLOCK, num_blocks=NUM_BLOCKS, dtype="float32",
                         device=device)
    return load_worker(opts)


def prompt_request(request_id: int, conversation: list[dict]) -> PromptRequest:
    """A fixture conversation as the conductor sends it: the last turn's text and speaker, every earlier
    turn as a reference clip (WAV bytes), its transcript and its speaker."""
    *context, last = conversation
    kwargs: dict = {"voice": last["role"]}
    if context:
        kwargs["context_audio"] = [wav_bytes(m["content"][1]["path"]) for m in context]
        kwargs["context_text"] = [m["content"][0]["text"] for m in context]
        kwargs["context_voice"] = [m["role"] for m in context]
    return PromptRequest(request_id, last["content"][0]["text"], ["text"], ["audio"], kwargs)




def Request(req_id: int, name: str, ids: list[int], handle: int, chunk: int, sampling: SamplingParams = GREEDY,
            max_frames: int = MAX_FRAMES) -> FrameRequest:
    """A request for conversation `name`: its prompt ids (process_prompt's text_inputs) and prompt frames' handle."""
    return FrameRequest(req_id, ids, handle, chunk, max_frames, sampling, name)


def _csm_stop(token: int, frame: list[int]) -> bool:
    stop = all(c == 0 for c in frame[:-1])
    assert token == (STOP if stop else frame[0]), f"token {token} for frame {frame}"
    return stop


class Driver(FrameDriver):
    """The frame driver over a loaded graph worker (graph work rides in its steps)."""

    def __init__(self, worker, seed: int = 0):
        super().__init__(worker.graph_runner.execute, K, _csm_stop, NUM_BLOCKS, BLOCK, seed)
        self.worker = worker

    def execute(self, step: Step):
        self.step_id += 1
        return wire(self.worker.graph_runner.execute(wire(step)))

    def prompts(self, requests: dict[int, list[dict]]) -> dict[int, tuple[list[int], int]]:
        """process_prompt for each (request id -> conversation), in a step with the running requests' rows:
        request id -> (text_inputs, the prompt_frames handle)."""
        result = self.step(GraphWork(prompts=[prompt_request(i, c) for i, c in requests.items()]))
        out = {}
        for request_id, pr in zip(requests, result.prompt_results, strict=True):
            assert pr.request_id == request_id and pr.error is None, pr.error
            values = {v.name: v.values for v in pr.values}
            assert sorted(values) == ["prompt_frames", "text_inputs"]
            (ids,), (frames,) = values["text_inputs"], values["prompt_frames"]
            assert ids.form == "tokens" and frames.form == "tensor" and frames.dtype == "int64"
            assert frames.shape == [len(ids.ids), K + 1] and frames.worker == 0
            out[request_id] = (ids.ids.tolist(), frames.handle)
        return out

    def frames_held(self) -> CsmFrames:
        return self.worker.runner.frames


@pytest.fixture(scope="module")
def expected(model_dir: Path, hf) -> dict:
    """Conversation name -> (the processor's input_ids, transformers' greedy codes [frames, K]), the context
    audio as the worker decodes its WAV bytes."""
    processor = transformers.CsmProcessor.from_pretrained(model_dir)
    out = {}
    for name, conversation in CONVERSATIONS.items():
        inputs = processor.apply_chat_template(as_decoded(conversation), tokenize=True, return_dict=True)
        with torch.no_grad():
            codes = hf.generate(**inputs, max_new_tokens=MAX_FRAMES, output_audio=False, do_sample=False, depth_decoder_do_sample=False)[0]
        out[name] = (inputs["input_ids"][0].tolist(), codes)
    return out


def test_the_graph_declares_the_backbone_a_frame_model(model_dir):
    worker = load(model_dir)
    graph = worker.ready.graph
    nodes = {n["name"]: n for n in graph["nodes"]}
    assert sorted(nodes) == ["backbone", "codec"]
    backbone, codec = nodes["backbone"], nodes["codec"]
    assert backbone["engine"] == "kv_cache" and backbone["kv_inputs"] == ["embeds"]
    assert backbone["frame_width"] == K and backbone["stop_token_ids"] == [STOP]
    assert codec["engine"] == "stateless" and codec["kv_inputs"] == [] and codec["frame_width"] == 0 and codec["stop_token_ids"] == []
    assert worker.ready.architecture == "CsmForConditionalGeneration" and worker.ready.vocab_size == 128256
    assert worker.ready.block_size == BLOCK and worker.ready.num_blocks == NUM_BLOCKS
    assert worker.nodes == ["backbone", "codec"]
    assert isinstance(worker.runner.frames, CsmFrames) and worker.runner.frames.width == K
    assert not worker.runner.overlap, "a frame model's tokens are needed on the host before the next step"
    # Ready goes over the wire too.
    assert wire(worker.ready).graph["nodes"] == graph["nodes"]


@pytest.fixture(scope="module")
def served(model_dir) -> tuple[Driver, dict[int, Request], dict]:
    """Five greedy requests through one worker (see the module docstring); request 2 is preempted after its
    fifth frame and re-added three steps later (recomputed in chunks of 5), request 4 after its first prompt
    chunk and re-added two steps later."""
    driver = Driver(load(model_dir), seed=1)
    # req_id -> (conversation, joins at step, chunk)
    plan = {1: ("speaker0", 0, 2), 2: ("context", 0, 3), 3: ("speaker1", 2, 2), 4: ("context_same_speaker", 4, 3),
            5: ("speaker0", 7, 3)}
    requests: dict[int, Request] = {}
    log: dict = {"preempted": {}, "held_while_out": None}

    def admit(joining: list[int]) -> None:
        prompts = driver.prompts({i: CONVERSATIONS[plan[i][0]] for i in joining})
        for i in joining:
            ids, handle = prompts[i]
            requests[i] = Request(i, plan[i][0], ids, handle, plan[i][2])
            driver.add(requests[i])

    admit([i for i, (_, start, _) in plan.items() if start == 0])  # a step with graph work only
    back: dict[int, int] = {}  # req_id -> the step it is re-added at
    s = 0
    while driver.running or driver.added or back or len(requests) < len(plan):
        for i, at in list(back.items()):
            if at == s:
                del back[i]
                if i == 2:
                    # Its 36 prompt positions and 5 outputs recomputed 5 a step: one chunk crosses from one into the other.
                    assert len(requests[i].ids) % 5 != 0
                    requests[i].chunk = 5
                driver.add(requests[i])
        if 2 in requests and 2 not in log["preempted"] and len(requests[2].frames) == 5 and not requests[2].done:
            log["preempted"][2] = len(requests[2].tokens)
            driver.remove(requests[2])
            back[2] = s + 3
        if 4 in requests and 4 not in log["preempted"] and requests[4].computed == requests[4].chunk:
            log["preempted"][4] = len(requests[4].tokens)
            driver.remove(requests[4])
            back[4] = s + 2
        joining = [i for i, (_, start, _) in plan.items() if start == s + 1]
        if joining:
            admit(joining)
        else:
            driver.step()
        if 2 in back and back[2] == s + 2:
            # Out of the worker (removed at step s): its frames are still held for the re-add.
            log["held_while_out"] = len(driver.frames_held().generated.get(2, ()))
        s += 1
        assert s < 400
    driver.step()  # the last removals
    return driver, requests, log


def test_requests_give_transformers_greedy_frames(served, expected):
    driver, requests, log = served
    assert driver.max_sampled >= 4, "several requests should sample in one step (one depth decoder run)"
    assert driver.steps_with_prefill_and_decode > 0, "prompt chunks should share steps with frame steps"
    assert log["preempted"] == {2: 5, 4: 0}
    assert log["held_while_out"] == 5
    assert not driver.running and not driver.worker.runner.requests
    for r in requests.values():
        ids, codes = expected[r.name]
        assert r.ids == ids, f"request {r.req_id}: process_prompt's text_inputs are the processor's"
        got = torch.tensor(r.frames)
        assert got.shape == codes.shape and torch.equal(got, codes), f"request {r.req_id} ({r.name})"
        assert r.tokens[-1] == STOP and STOP not in r.tokens[:-1], f"request {r.req_id}: ends on (only) the stop frame"
        assert r.tokens[:-1] == [f[0] for f in r.frames[:-1]]
        assert 5 < len(r.frames) < MAX_FRAMES
    # The context audio reached the backbone: its frames are in the prompt the request ran with.
    store = driver.worker.graph_runner.nodes.store
    prompt = store.get(requests[2].handle)
    assert (torch.tensor(requests[2].ids) == AUDIO_TOKEN_ID).sum() > 1 and (prompt[:, 0] > 0).sum() > 1
    assert len({tuple(expected[name][1][0].tolist()) for name in CONVERSATIONS}) == len(CONVERSATIONS)


def test_finished_requests_release_their_frames(served):
    driver, requests, _ = served
    held = driver.frames_held().generated
    # Removed from the rows (finished) but not yet ended as graph requests: the frames are still held.
    assert sorted(held) == sorted(requests)
    for r in requests.values():
        assert np.array_equal(np.stack(held[r.req_id]), np.array(r.frames, np.int32)), f"request {r.req_id}"
    store = driver.worker.graph_runner.nodes.store
    handles = [r.handle for r in requests.values()]
    assert all(store.refs(h) == 1 for h in handles)
    driver.execute(Step(driver.step_id, [], i32(), i32(), i32(), i32(), i32(), i32(), np.zeros(0, np.uint8),
                        graph=GraphWork(releases=i32(*handles[:3]), finished_requests=i32(1, 3))))
    assert sorted(held) == [2, 4, 5]
    driver.execute(Step(driver.step_id, [], i32(), i32(), i32(), i32(), i32(), i32(), np.zeros(0, np.uint8),
                        graph=GraphWork(releases=i32(*handles[3:]), finished_requests=i32(2, 4, 5, 77))))
    assert held == {} and driver.frames_held().generators == {}
    assert all(store.refs(h) == 0 for h in handles)


def test_a_request_ended_while_its_rows_run_keeps_its_frames_until_removed(model_dir):
    """A client leaves: the graph request ends (finished_requests) in a step that still runs its row (the
    engine's abort comes a step later); that step and the next run it from its frames, which go at removal."""
    driver = Driver(load(model_dir))
    ids, handle = driver.prompts({1: CONVERSATIONS["speaker0"]})[1]
    r = Request(1, "speaker0", ids, handle, chunk=64)
    driver.add(r)
    for _ in range(4):
        driver.step()
    assert len(r.frames) == 4 and not r.done
    driver.step(GraphWork(finished_requests=i32(1)))
    driver.step()
    assert len(r.frames) == 6 and 1 in driver.frames_held().generated
    driver.remove(r)
    driver.step()
    assert driver.frames_held().generated == {} and driver.frames_held().ended == set()


def test_bad_added_requests_are_named(model_dir):
    driver = Driver(load(model_dir))
    worker = driver.worker
    store = worker.graph_runner.nodes.store
    ids, good = driver.prompts({1: CONVERSATIONS["speaker0"]})[1]
    frames = store.get(good)
    p = len(ids)
    narrow = store.put(frames[:, :K].clone()).handle
    short = store.put(frames[:-1].clone()).handle
    int32 = store.put(frames.to(torch.int32)).handle
    vector = store.put(frames[:, 0].clone().float()).handle

    def added(req_id, tokens, embeds):
        return AddedRequest(req_id, i32(*tokens), p, GREEDY, embeds=embeds)

    where = r"Step\.added\[0\]\.embeds: "
    cases = [
        (added(9, ids, -1), where + "this worker's model takes its prompt as frames; none were given"),
        (added(9, ids, 999_999), where + "tensor handle 999999 is not in this worker's store"),
        (added(9, ids, narrow), where + rf"prompt frames must be int64 \[{p}, {K + 1}\], got torch\.int64 \({p}, {K}\)"),
        (added(9, ids, short), where + rf"prompt frames must be int64 \[{p}, {K + 1}\], got torch\.int64 \({p - 1}, {K + 1}\)"),
        (added(9, ids, int32), where + rf"prompt frames must be int64 \[{p}, {K + 1}\], got torch\.int32 \({p}, {K + 1}\)"),
        (added(9, ids, vector), where + rf"prompt frames must be int64 \[{p}, {K + 1}\], got torch\.float32 \({p},\)"),
        # A resumed request whose outputs this worker never generated (it cannot know their frames).
        (added(9, [*ids, 5, 6], good), where + "2 output positions but this worker generated 0 frames for the request"),
    ]
    for request, error in cases:
        step = Step(driver.step_id, [request], i32(), i32(9), i32(4), i32(0), i32(1), i32(0), np.ones(1, np.uint8))
        with pytest.raises(ProtocolError, match=error):
            worker.graph_runner.execute(wire(step))
        driver.step_id += 1
        assert 9 not in worker.runner.requests
    # A request that generated 3 frames, preempted: re-added with 4 outputs it is refused; with its 3 it runs on.
    r = Request(9, "speaker0", ids, good, chunk=4, max_frames=3)
    driver.add(r)
    while driver.running:
        driver.step()
    assert len(r.frames) == 3 and len(worker.runner.frames.generated[9]) == 3
    driver.step()  # removed
    step = Step(driver.step_id, [added(9, [*ids, *r.tokens, 7], good)], i32(), i32(), i32(), i32(), i32(), i32(), np.zeros(0, np.uint8))
    with pytest.raises(ProtocolError, match=where + "4 output positions but this worker generated 3 frames for the request"):
        worker.graph_runner.execute(wire(step))
    driver.step_id += 1
    r.max_frames = 6
    r.done = False
    driver.add(r)
    while driver.running:
        driver.step()
    assert len(r.frames) == 6 and len(worker.runner.frames.generated[9]) == 6


def test_seeded_sampling_is_reproducible(model_dir):
    """Seed 7 twice (beside another request, then alone and preempted mid-generation) gives the same frames;
    seed 8 other frames."""
    driver = Driver(load(model_dir), seed=2)
    ids, handle = driver.prompts({1: CONVERSATIONS["speaker1"]})[1]

    def sampled(req_id, seed):
        return Request(req_id, "speaker1", ids, handle, chunk=3, max_frames=12,
                       sampling=SamplingParams(temperature=1.0, top_k=50, seed=seed))

    a, c = sampled(31, 7), sampled(33, 8)
    driver.add(a)
    driver.add(c)
    while driver.running:
        driver.step()
    b = sampled(32, 7)
    driver.add(b)
    while len(b.frames) < 5:
        driver.step()
    driver.remove(b)
    driver.step()
    driver.step()
    driver.add(b)
    while driver.running:
        driver.step()
    assert len(a.frames) >= 6
    assert b.frames == a.frames and b.tokens == a.tokens
    assert c.frames != a.frames
    # Sampled, not greedy: the codebooks beyond 0 differ between the seeds too.
    assert any(fa[1:] != fc[1:] for fa, fc in zip(a.frames, c.frames))
    greedy = Request(34, "speaker1", ids, handle, chunk=3, max_frames=len(a.frames))
    driver.add(greedy)
    while driver.running:
        driver.step()
    assert greedy.frames != a.frames


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_worker_mixes_prompt_and_generated_frames(model_dir):
    """The store holds the prompt frames on the GPU, the worker's generated frames are on the host: a step with
    one request's prompt chunk beside another's frame step (and a preempted request's recompute, whose chunks
    cross from its prompt into its outputs) must gather both."""
    driver = Driver(load(model_dir, "cuda"), seed=3)
    assert driver.worker.ready.device.startswith("cuda")
    prompts = driver.prompts({1: CONVERSATIONS["speaker0"], 2: CONVERSATIONS["context"]})
    first = Request(1, "speaker0", *prompts[1], chunk=2, max_frames=12)
    second = Request(2, "context", *prompts[2], chunk=3, max_frames=12)
    assert driver.worker.graph_runner.nodes.store.get(first.handle).is_cuda
    driver.add(first)
    for _ in range(len(first.ids) + 2):
        driver.step()
    driver.add(second)
    while len(first.frames) < 8 and not first.done:
        driver.step()
    if not first.done:
        driver.remove(first)
        driver.step()
        driver.add(first)
    while driver.running:
        driver.step()
    assert driver.steps_with_prefill_and_decode > 0
    assert first.frames and second.frames
