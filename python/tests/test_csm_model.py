"""CSM's worker-side model pieces (baton_worker.models.csm.model) in the paged
step machinery, against the plain reference loop and transformers, on the tiny
random directory (float32, CPU):

- a small greedy engine serves six requests at once (both speakers, with and
  without a context utterance, two of them twice): requests join at different
  steps, prompts go in as chunks of 2-4 frames beside other rows' frame steps,
  block ids come from a shuffled free list and a finished request's blocks are
  reused. Each step: the backbone over every row's new frames -> codebook 0
  greedy for the rows at the end of their input -> the depth decoder for all
  of them at once -> the next input frame. Every request's codes equal
  reference.generate_codes and CsmForConditionalGeneration.generate (greedy at
  both levels) frame for frame, ending on the stop frame;
- the two backbone entries (embed + hidden_states_from_embeds, and
  hidden_states over frames) give the same rows, and embed(prompt_frames(...))
  is the reference's (transformers') prompt embedding, context audio and
  <|audio_eos|> included;
- the depth decoder over R rows together gives each row's codes (and logits to
  rounding) as that row alone;
- frame_stops is transformers' stop rule.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from csm_fixtures import CONVERSATIONS, CSM_MARKS, context_codes, hf, model_dir  # noqa: F401  (fixtures)

transformers = pytest.importorskip("transformers")

from baton_worker.attention import AttentionMetadata, make_backend  # noqa: E402
from baton_worker.attention.kv_cache import KVCache  # noqa: E402
from baton_worker.models.csm.build import AUDIO_EOS_TOKEN_ID, AUDIO_TOKEN_ID, NUM_CODEBOOKS  # noqa: E402
from baton_worker.models.csm.model import (  # noqa: E402
    CsmBackbone,
    CsmDepthDecoder,
    audio_frames,
    frame_stops,
    greedy,
    load_csm,
    prompt_frames,
)
from baton_worker.models.csm.reference import CsmReference, generate_codes  # noqa: E402

MAX_FRAMES = 80
BLOCK_SIZE = 4
K = NUM_CODEBOOKS

pytestmark = CSM_MARKS


@pytest.fixture(scope="module")
def config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


@pytest.fixture(scope="module")
def prompts(model_dir: Path, hf) -> dict:
    """name -> (processor inputs, input_ids [T], context codes [N, K] or None)."""
    processor = transformers.CsmProcessor.from_pretrained(model_dir)
    out = {}
    for name, conversation in CONVERSATIONS.items():
        inputs = processor.apply_chat_template(conversation, tokenize=True, return_dict=True)
        out[name] = (inputs, inputs["input_ids"][0], context_codes(hf, inputs))
    return out


@pytest.fixture(scope="module")
def models(model_dir: Path) -> tuple[CsmBackbone, CsmDepthDecoder]:
    return load_csm(model_dir, torch.float32, "cpu")


# --- a small engine: greedy CSM generation of many requests batched step by step ---


@dataclass
class Request:
    name: str
    prompt: torch.Tensor  # frames [P, K+1]
    start_step: int
    chunk: int  # prompt frames per step
    output: list[torch.Tensor] = field(default_factory=list)  # generated frames [K]
    computed: int = 0  # positions whose K/V are in the cache
    blocks: list[int] = field(default_factory=list)

    def frames(self, start: int, end: int) -> torch.Tensor:
        """Input frames of positions start..end-1: the prompt's, then the generated frames fed back."""
        p = self.prompt.shape[0]
        rows = [self.prompt[start:min(end, p)]]
        if end > p:
            rows.append(audio_frames(torch.stack(self.output[max(start, p) - p : end - p])))
        return torch.cat(rows)

    @property
    def length(self) -> int:
        return self.prompt.shape[0] + len(self.output)

    @property
    def codes(self) -> torch.Tensor:
        return torch.stack(self.output)


@dataclass
class Sampled:
    """One step's sampled rows: what the depth decoder got and gave."""

    h: torch.Tensor
    c0: torch.Tensor
    codes: torch.Tensor


class Engine:
    """Each step every live request adds its next prompt chunk or its last generated frame; a request samples
    when its new positions reach the end of its input. Blocks come from a shuffled free list and go back to it
    when a request finishes (a stop frame or MAX_FRAMES)."""

    def __init__(self, backbone: CsmBackbone, depth: CsmDepthDecoder, num_blocks: int, seed: int = 0):
        self.backbone, self.depth = backbone, depth
        c = backbone.config
        self.cache = KVCache(c, num_blocks, BLOCK_SIZE, torch.float32, torch.device("cpu"))
        self.attention = make_backend("cpu", self.cache, c.num_heads, backbone.scale, c.sliding_windows)
        self.free = np.random.default_rng(seed).permutation(num_blocks).tolist()
        self.returned: set[int] = set()  # blocks of finished requests
        self.reused = 0  # blocks handed out again
        self.max_rows = 0
        self.mixed_steps = 0  # steps with a prefill chunk beside frame steps
        self.both_entries_checked = 0
        self.sampled: list[Sampled] = []

    def _take(self, n: int) -> list[int]:
        blocks = [self.free.pop() for _ in range(n)]
        self.reused += len(self.returned.intersection(blocks))
        return blocks

    def run(self, requests: list[Request]) -> None:
        pending = sorted(requests, key=lambda r: r.start_step)
        live: list[Request] = []
        step = 0
        while pending or live:
            while pending and pending[0].start_step <= step:
                live.append(pending.pop(0))
            if live:
                for r in self._step(live, step):
                    live.remove(r)
                    self.free += r.blocks
                    self.returned.update(r.blocks)
            step += 1

    def _step(self, live: list[Request], step: int) -> list[Request]:
        bs = BLOCK_SIZE
        frames, positions, slots, query_start, seq_lens, tables, sampled, last = [], [], [], [0], [], [], [], []
        prefill = decode = False
        for r in live:
            p = r.prompt.shape[0]
            n = min(r.chunk, p - r.computed) if r.computed < p else 1
            prefill |= r.computed < p
            decode |= r.computed >= p
            end = r.computed + n
            r.blocks += self._take(-(-end // bs) - len(r.blocks))
            frames.append(r.frames(r.computed, end))
            positions += list(range(r.computed, end))
            slots += [r.blocks[q // bs] * bs + q % bs for q in range(r.computed, end)]
            query_start.append(query_start[-1] + n)
            seq_lens.append(end)
            tables.append(r.blocks)
            r.computed = end
            if end == r.length:
                sampled.append(r)
                last.append(query_start[-1] - 1)
        self.max_rows = max(self.max_rows, len(live))
        self.mixed_steps += prefill and decode
        table = torch.zeros(len(live), max(len(t) for t in tables), dtype=torch.int64)
        for i, t in enumerate(tables):
            table[i, : len(t)] = torch.tensor(t)
        meta = AttentionMetadata(torch.tensor(slots), np.array(query_start, np.int64), np.array(seq_lens, np.int64), table, bs)
        frames, positions = torch.cat(frames), torch.tensor(positions)
        attention = self.attention.prepare(meta)
        # Both backbone entries, on alternate steps; on a mixed step (text and audio rows) both, which must agree.
        if step % 2 == 0 or (prefill and decode and not self.both_entries_checked):
            hidden = self.backbone.hidden_states_from_embeds(self.backbone.embed(frames), positions, attention)
            if step % 2 == 1:
                # Writing the same K/V again is harmless.
                assert torch.equal(self.backbone.hidden_states(frames, positions, self.attention.prepare(meta)), hidden)
                self.both_entries_checked += 1
        else:
            hidden = self.backbone.hidden_states(frames, positions, attention)
        if not sampled:
            return []
        h = self.backbone.head_input(hidden, torch.tensor(last))
        c0 = greedy(self.backbone.codebook0_logits(h), 0)
        codes = self.depth.frames(h, c0, greedy)
        self.sampled.append(Sampled(h, c0, codes))
        stops = frame_stops(codes).tolist()
        done = []
        for r, frame, stop in zip(sampled, codes, stops):
            r.output.append(frame)
            if stop or len(r.output) == MAX_FRAMES:
                done.append(r)
        return done


@pytest.fixture(scope="module")
def served(models, prompts, config) -> tuple[Engine, list[Request]]:
    backbone, depth = models
    plan = [("speaker0", 0, 3), ("context", 0, 4), ("speaker1", 2, 2), ("context_same_speaker", 5, 3),
            ("speaker0", 9, 4), ("context", 14, 2)]
    requests = [Request(name, prompt_frames(prompts[name][1], prompts[name][2], config), start, chunk)
                for name, start, chunk in plan]
    # Room for fewer than all requests at their longest: finished requests' blocks must be reused.
    engine = Engine(backbone, depth, num_blocks=90)
    engine.run(requests)
    return engine, requests


def test_served_codes_equal_reference_and_transformers(served, prompts, model_dir: Path, hf):
    engine, requests = served
    assert engine.max_rows >= 4, "the requests should overlap in the batch"
    assert engine.reused > 0, "finished requests' blocks should be reused"
    assert engine.mixed_steps > 0 and engine.both_entries_checked, "prefill chunks should share steps with frame steps"
    assert max(len(s.c0) for s in engine.sampled) >= 3, "the depth decoder should run several rows at once"
    expected = {}
    for name in CONVERSATIONS:
        inputs, ids, context = prompts[name]
        reference = generate_codes(model_dir, ids, MAX_FRAMES, context)
        with torch.no_grad():
            theirs = hf.generate(**inputs, max_new_tokens=MAX_FRAMES, output_audio=False, do_sample=False,
                                 depth_decoder_do_sample=False)[0]
        assert torch.equal(reference, theirs), f"{name}: the reference loop and transformers differ"
        expected[name] = reference
    for r in requests:
        got = r.codes
        assert got.shape == expected[r.name].shape and torch.equal(got, expected[r.name]), f"{r.name} (joined at step {r.start_step})"
        assert bool(frame_stops(got[-1:])[0]) and not frame_stops(got[:-1]).any(), f"{r.name}: should end on (only) the stop frame"
        assert 10 <= got.shape[0] < MAX_FRAMES
    # The conversations give different codes.
    assert len({tuple(expected[name][0].tolist()) for name in CONVERSATIONS}) == len(CONVERSATIONS)


def test_prompt_embeddings_equal_reference(models, prompts, model_dir: Path, config):
    backbone, _ = models
    reference = CsmReference(model_dir)
    for name, (_, ids, context) in prompts.items():
        frames = prompt_frames(ids, context, config)
        assert torch.equal(backbone.embed(frames), reference.prompt_embeddings(ids, context)), name
        if context is not None:
            audio = frames[:, 0] >= 0
            assert int(audio.sum()) == context.shape[0] + 1  # the context frames and <|audio_eos|>'s zero frame
            assert torch.equal(frames[ids == AUDIO_TOKEN_ID, :K], context)
            assert (frames[ids == AUDIO_EOS_TOKEN_ID, :K] == 0).all()
    # Without the codes, <|AUDIO|> and <|audio_eos|> keep their text embedding (transformers does the same).
    _, ids, _ = prompts["context"]
    assert torch.equal(backbone.embed(prompt_frames(ids, None, config)), reference.prompt_embeddings(ids, None))


def test_depth_decoder_batched_equals_alone(served, models):
    engine, _ = served
    _, depth = models
    # Rows sampled at different steps, end-of-stream frames (code 0 = 0) among them.
    h = torch.cat([s.h for s in engine.sampled[::7]])
    c0 = torch.cat([s.c0 for s in engine.sampled[::7]])
    served_codes = torch.cat([s.codes for s in engine.sampled[::7]])
    stop = [i for i, s in enumerate(engine.sampled) if bool((s.c0 == 0).any())][0]
    h, c0 = torch.cat((h, engine.sampled[stop].h)), torch.cat((c0, engine.sampled[stop].c0))
    served_codes = torch.cat((served_codes, engine.sampled[stop].codes))
    assert h.shape[0] >= 8 and bool((c0 == 0).any())

    def recorder(log: list):
        def sample(logits: torch.Tensor, k: int) -> torch.Tensor:
            log.append((k, logits))
            return greedy(logits, k)
        return sample

    together: list = []
    codes = depth.frames(h, c0, recorder(together))
    assert torch.equal(codes, served_codes)
    assert [k for k, _ in together] == list(range(1, K))
    for i in range(h.shape[0]):
        alone: list = []
        row = depth.frames(h[i : i + 1], c0[i : i + 1], recorder(alone))
        assert torch.equal(row[0], codes[i]), f"row {i}"
        for (_, batched), (_, single) in zip(together, alone):
            torch.testing.assert_close(batched[i : i + 1], single, atol=1e-5, rtol=1e-5)


def test_frame_stops():
    frames = torch.tensor([
        [0] * (K - 1) + [0],
        [0] * (K - 1) + [17],  # the last codebook is not looked at
        [0] * (K - 2) + [5, 0],
        [3] + [0] * (K - 1),
        [1] * K,
    ])
    assert frame_stops(frames).tolist() == [True, True, False, False, False]
    assert frame_stops(torch.zeros(0, K, dtype=torch.int64)).shape == (0,)
