"""Multi-LoRA in the worker, against transformers + PEFT.

Four seeded PEFT adapters (random_loras.py: ranks 4 to 16, rsLoRA, attention
only, all seven projections, MLP only, one layer only) on random-weight Qwen3
and Llama bases. Requests of every adapter and of the base model share steps
(chunked prefills and decodes) through the real StepRunner, driven by
EngineSim with wire round trips; their greedy tokens must be exactly those
of the adapter merged into the base (merge_and_unload) under transformers'
generate. The Triton kernels (CUDA's path) run in Triton's interpreter
against the torch path; bad adapters fail their load with one line and the
worker serves on; protocol violations name the field.
"""

from __future__ import annotations

import json
import random
import re
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from baton_worker.lora import LoraBatch, LoraLayout, LoraManager
from baton_worker.lora.manager import LoraSlots
from baton_worker.model.config import ConfigError
from baton_worker.protocol import AddedRequest, LoraLoad, LoraWork, ProtocolError, SamplingParams, Step
from baton_worker.runtime.loading import load_worker
from baton_worker.runtime.options import OptionsError, WorkerOptions, parse_options
from engine_sim import EngineSim, SimRequest
from hf_reference import load_model
from random_loras import SPECS, LoraSpec, make_lora_dir, make_lora_dirs, peft_greedy
import random_loras
from random_models import make_model_dir

NEW_TOKENS = 12
BLOCK = 4
NUM_BLOCKS = 160
NAMES = list(SPECS)  # a1..a4, lora ids 1..4
GREEDY = SamplingParams(temperature=0.0)
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(512) for _ in range(n)] for n in (3, 9, 14)]


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def case(request, tmp_path_factory, one_torch_thread):
    """(base dir, adapter dirs by name, prompts, reference outputs by adapter name ('' = base))."""
    root = tmp_path_factory.mktemp(request.param)
    base_dir = make_model_dir(request.param, root / "base", variant=0)
    loras = make_lora_dirs(base_dir, root / "loras")
    prompts = _prompts(len(request.param))
    base = load_model(base_dir, "float32")
    expected = {"": peft_greedy(base_dir, None, prompts, NEW_TOKENS, base=base)}
    for name in NAMES:
        expected[name] = peft_greedy(base_dir, loras[name], prompts, NEW_TOKENS, base=base)
    return base_dir, loras, prompts, expected


def _worker(base_dir, max_loras=4, max_lora_rank=16, **kwargs):
    # float32 everywhere (on a GPU too: the real kernels then), as the reference runs.
    opts = WorkerOptions(model=str(base_dir), in_endpoint="", out_endpoint="", block_size=BLOCK, num_blocks=NUM_BLOCKS,
                         max_loras=max_loras, max_lora_rank=max_lora_rank, dtype="float32", **{k: v for k, v in kwargs.items() if k != "fuse_weights"})
    return load_worker(opts, fuse_weights=kwargs.get("fuse_weights", True))


def _load_all(loras) -> LoraWork:
    return LoraWork([LoraLoad(i + 1, name, str(loras[name])) for i, name in enumerate(NAMES)], np.zeros(0, np.int32))


def _run_mixed(runner, loras, prompts, budget=11, seed=0):
    """Every prompt under the base model and each adapter, arrivals staggered; returns
    {adapter name: outputs} and the simulator (its steps)."""
    sim = EngineSim(runner, BLOCK, NUM_BLOCKS, token_budget=budget, seed=seed)
    sim.pending_lora = _load_all(loras)
    requests = []
    for j, prompt in enumerate(prompts):  # adapters interleaved: a step's first rows already span them all
        for lora_id in range(len(NAMES) + 1):
            requests.append(SimRequest(len(requests), prompt, NEW_TOKENS, GREEDY, arrive_step=j + lora_id % 3, lora_id=lora_id))
    sim.run(requests)
    assert all(len(r.lora_load_failed) == 0 for r in sim.results)
    outputs = {name: [r.output for r in requests if r.lora_id == lora_id] for lora_id, name in enumerate([""] + NAMES)}
    return outputs, sim, requests


def _mixing(sim, requests) -> tuple[int, bool]:
    """The most adapters (the base model counted as one) in one step, and whether some step mixed adapter
    prefill chunks with adapter decodes."""
    lora_of = {r.req_id: r.lora_id for r in requests}
    widest, mixed = 0, False
    for step in sim.steps:
        ids = [lora_of[int(q)] for q in step.req_ids]
        widest = max(widest, len(set(ids)))
        counts = step.num_new_tokens.tolist()
        if any(n > 1 and i for n, i in zip(counts, ids)) and any(n == 1 and i for n, i in zip(counts, ids)):
            mixed = True
    return widest, mixed


def test_adapters_change_greedy_output(case):
    _, _, _, expected = case
    for name in NAMES:
        assert expected[name] != expected[""], f"adapter {name} does not change greedy output"
        assert all(len(set(out)) > 3 for out in expected[name])


def test_mixed_adapters_match_peft_merged(case):
    base_dir, loras, prompts, expected = case
    outputs, sim, requests = _run_mixed(_worker(base_dir).runner, loras, prompts)
    widest, mixed = _mixing(sim, requests)
    assert widest == 5 and mixed, "steps should mix all four adapters with base rows, prefill chunks and decodes"
    assert any(((s.num_computed > 0) & (s.num_new_tokens > 1)).any() for s in sim.steps), "no chunked prefill"
    assert outputs == expected


def test_overlapped_steps_match(case):
    """Overlap ("async") scheduling, as a CUDA worker runs: adapter rows of step N + 1 launched
    before step N's tokens are on the host (a step with LoRA work never overlaps)."""
    base_dir, loras, prompts, expected = case
    runner = _worker(base_dir).runner
    runner.overlap = True
    sim = EngineSim(runner, BLOCK, NUM_BLOCKS, token_budget=11, overlap=True)
    sim.pending_lora = _load_all(loras)
    requests = [SimRequest(i, prompts[i % 3], NEW_TOKENS, GREEDY, arrive_step=i % 4, lora_id=i % 5) for i in range(10)]
    sim.run(requests)
    assert sim.overlapped > 0
    assert [r.output for r in requests] == [expected[([""] + NAMES)[i % 5]][i % 3] for i in range(10)]


def test_unfused_projections_match(case):
    """fuse_weights=False (q/k/v and gate/up apart): each module's delta to its own output."""
    base_dir, loras, prompts, expected = case
    outputs, _, _ = _run_mixed(_worker(base_dir, fuse_weights=False).runner, loras, prompts[1:], budget=16, seed=2)
    assert outputs == {name: out[1:] for name, out in expected.items()}


def test_kernel_path_in_the_interpreter_matches(case):
    """The CUDA path (the Triton kernels over slot stacks), here in Triton's interpreter, end to end:
    three slots for four adapters, so slots are reused between steps."""
    pytest.importorskip("triton")
    base_dir, loras, prompts, expected = case
    runner = _worker(base_dir, max_loras=3).runner
    lora = runner.lora
    lora.slots = LoraSlots(lora.layout, lora.max_loras, lora.max_rank, lora.device, lora.dtype)
    sim = EngineSim(runner, BLOCK, NUM_BLOCKS, token_budget=12, seed=1, max_loras=3)
    sim.pending_lora = _load_all(loras)
    prompt = prompts[1]
    requests = [SimRequest(i, prompt, 6, GREEDY, arrive_step=i // 2, lora_id=i) for i in range(5)]
    sim.run(requests)
    assert [r.output for r in requests] == [expected[name][1][:6] for name in [""] + NAMES]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kernels_equal_the_torch_path(case, dtype):
    """shrink + expand per projection group against the torch path: mixed segments out of order,
    base tokens between them, a segment over several tiles, ranks 4 to 16 padded to 80 (two rank
    chunks in the expand).
    (Triton's interpreter mishandles bfloat16: float32 and float16 here.)"""
    pytest.importorskip("triton")
    base_dir, loras, _, _ = case
    layout = _worker(base_dir).runner.lora.layout
    torch_path = LoraManager(layout, 4, 80, DEVICE, dtype, kernels=False)
    kernel_path = LoraManager(layout, 4, 80, DEVICE, dtype, kernels=True)
    for i, name in enumerate(NAMES):
        assert torch_path.load(i + 1, name, str(loras[name])) is None
        assert kernel_path.load(i + 1, name, str(loras[name])) is None
    token_lora = np.array([0, 3, 3, 1, 0, 4, 2, 2, 1] + [2] * 20 + [0, 0, 3, 1, 4], np.int32)
    want, got = torch_path.batch(token_lora), kernel_path.batch(token_lora)
    gen = torch.Generator().manual_seed(0)
    for layer in range(layout.num_layers):
        for group in range(len(layout.groups)):
            x = torch.randn(len(token_lora), layout.in_features(group), generator=gen).to(DEVICE, dtype)
            y = torch.randn(len(token_lora), layout.bounds(group)[-1], generator=gen).to(DEVICE, dtype)
            y_torch, y_kernel = y.clone(), y.clone()
            want.add_(y_torch, x, layer, group)
            got.add_(y_kernel, x, layer, group)
            # float16: the torch path rounds x A^T and the delta before adding, the kernels once at the end.
            tolerance = 1e-4 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(y_kernel.float(), y_torch.float(), atol=tolerance, rtol=tolerance)
            assert not torch.equal(y_torch, y) or not got.present[layer, group]
            base = torch.from_numpy(token_lora == 0).to(DEVICE)
            assert torch.equal(y_kernel[base], y[base])  # base tokens untouched


def test_kernels_on_random_stacks():
    """shrink and expand by themselves, full random stacks (every rank entry nonzero, R = 72: two
    chunks of the expand's rank loop), two modules of different widths, tiles of partial segments."""
    pytest.importorskip("triton")
    from baton_worker.lora.kernels import BLOCK_M, lora_expand, lora_shrink

    gen = torch.Generator().manual_seed(3)
    slots, rank, fan_in, bounds = 3, 72, 48, [0, 40, 64]
    a = torch.randn(slots, 2 * rank, fan_in, generator=gen).to(DEVICE)
    b = torch.randn(slots, bounds[-1], rank, generator=gen).to(DEVICE)
    x = torch.randn(30, fan_in, generator=gen).to(DEVICE)
    y = torch.randn(30, bounds[-1], generator=gen).to(DEVICE)
    order = torch.tensor([4, 9, 0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 22], device=DEVICE)
    segments = [(0, 2, 2), (2, 22, 0)]  # (start, end, slot) in order; tokens 21, 23.. are the base model's
    tiles = torch.tensor([(s + i, e, slot) for s, e, slot in segments for i in range(0, e - s, BLOCK_M)], dtype=torch.int32, device=DEVICE)
    t = lora_shrink(x, a, order, tiles)
    got = y.clone()
    lora_expand(got, t, b, order, tiles, torch.tensor(bounds, dtype=torch.int32, device=DEVICE), 40)
    want = y.clone()
    for s, e, slot in segments:
        rows = order[s:e]
        shrunk = x[rows] @ a[slot].T
        torch.testing.assert_close(t[s:e], shrunk, atol=1e-4, rtol=1e-4)
        for m in range(2):
            lo, hi = bounds[m], bounds[m + 1]
            want[rows, lo:hi] += shrunk[:, m * rank : (m + 1) * rank] @ b[slot, lo:hi].T
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-4)


def test_patterns_and_regex_targets(case, tmp_path):
    """rank_pattern / alpha_pattern per module, and target_modules as a regex string, as PEFT reads them."""
    base_dir, loras, prompts, expected = case
    spec = LoraSpec(8, 16, ("q_proj", "o_proj", "down_proj"), rank_pattern=(("o_proj", 4),), alpha_pattern=(("down_proj", 40),))
    patterned = make_lora_dir(base_dir, tmp_path / "patterned", spec, seed=5)
    want = peft_greedy(base_dir, patterned, prompts[:2], NEW_TOKENS)
    assert want != expected[""][:2]
    regex = _break(loras["a1"], tmp_path / "regex", lambda c: c.update(target_modules=r".*\.(q|v)_proj"))
    runner = _worker(base_dir, max_loras=2).runner
    sim = EngineSim(runner, BLOCK, NUM_BLOCKS, token_budget=10)
    sim.pending_lora = LoraWork([LoraLoad(1, "patterned", str(patterned)), LoraLoad(2, "regex", str(regex))], np.zeros(0, np.int32))
    requests = [SimRequest(i, p, NEW_TOKENS, GREEDY, lora_id=1 + i // 2) for i, p in enumerate(prompts[:2] * 2)]
    sim.run(requests)
    assert len(sim.results[0].lora_load_failed) == 0, sim.results[0].lora_load_errors
    assert [r.output for r in requests] == want + expected["a1"][:2]


def _break(src, dst, edit_config=None, edit_weights=None, drop=()):
    shutil.copytree(src, dst)
    if edit_config is not None:
        path = dst / "adapter_config.json"
        config = json.loads(path.read_text())
        edit_config(config)
        path.write_text(json.dumps(config))
    if edit_weights is not None:
        path = dst / "adapter_model.safetensors"
        weights = load_file(str(path))
        edit_weights(weights)
        save_file(weights, str(path))
    for name in drop:
        (dst / name).unlink()
    return dst


def test_bad_adapters_fail_their_load_and_the_worker_serves_on(case, tmp_path):
    base_dir, loras, prompts, expected = case
    a1, a2 = loras["a1"], loras["a2"]
    arch = "Qwen3ForCausalLM" if "qwen3" in str(base_dir) else "LlamaForCausalLM"
    a1_layer1 = "base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"

    def extra_layer(w):
        for key in [k for k in w if ".layers.1." in k]:
            w[key.replace(".layers.1.", ".layers.2.")] = w[key].clone()

    def narrow(w):
        w[a1_layer1] = w[a1_layer1][:, :-1].contiguous()

    bad = {
        "rank": (loras["a3"], r"rank 16 exceeds --max-lora-rank 8"),
        "target": (_break(a1, tmp_path / "target", lambda c: c.update(target_modules=["q_proj", "foo_proj"])),
                   rf"target module foo_proj is not a module of {arch} \(q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj\)"),
        "head": (_break(a1, tmp_path / "head", lambda c: c.update(target_modules=["q_proj", "lm_head"])),
                 r"target module lm_head is not supported \(LoRA applies to q_proj, "),
        "noconfig": (_break(a1, tmp_path / "noconfig", drop=["adapter_config.json"]), r"adapter_config\.json not found"),
        "noweights": (_break(a1, tmp_path / "noweights", drop=["adapter_model.safetensors"]),
                      r"adapter_model\.safetensors not found \(nor adapter_model\.bin\)"),
        "layers": (_break(a1, tmp_path / "layers", edit_weights=extra_layer), rf"the adapter has weights for 3 layers, {arch} has 2"),
        "shape": (_break(a1, tmp_path / "shape", edit_weights=narrow), rf"weight {a1_layer1.replace('.', '[.]')} has shape \[4, \d+\], expected"),
        "dora": (_break(a1, tmp_path / "dora", lambda c: c.update(use_dora=True)), r"DoRA \(use_dora\) is not supported"),
        "bias": (_break(a1, tmp_path / "bias", lambda c: c.update(bias="all")), r"bias 'all' is not supported"),
        "save": (_break(a1, tmp_path / "save", lambda c: c.update(modules_to_save=["lm_head"])), r"modules_to_save is not supported"),
        "missing": (tmp_path / "nowhere", r"not a directory"),
    }
    # The same weights as adapter_model.bin (torch.save), which loads like the safetensors file.
    as_bin = shutil.copytree(a2, tmp_path / "as_bin")
    torch.save(load_file(str(as_bin / "adapter_model.safetensors")), as_bin / "adapter_model.bin")
    (as_bin / "adapter_model.safetensors").unlink()

    loaded = _worker(base_dir, max_loras=2, max_lora_rank=8)
    loads = [LoraLoad(10 + i, name, str(path)) for i, (name, (path, _)) in enumerate(bad.items())]
    loads += [LoraLoad(1, "a1", str(a1)), LoraLoad(2, "a2", str(as_bin))]
    step = Step(0, [], *(np.zeros(0, np.int32),) * 6, np.zeros(0, np.uint8), lora=LoraWork(loads, np.zeros(0, np.int32)))
    result = loaded.graph_runner.execute(step)  # a step of LoRA work only, through the server's runner
    assert result.lora_load_failed.tolist() == [10 + i for i in range(len(bad))]
    for (name, (path, pattern)), line in zip(bad.items(), result.lora_load_errors):
        assert line.startswith(f"adapter {name} ({path}): "), line
        assert "\n" not in line
        assert re.search(pattern, line), (name, line)
    # A failed id stays unknown: a request of it is a protocol error; the good adapters serve.
    with pytest.raises(ProtocolError, match=r"^Step\.added\[0\]\.lora_id: adapter 10 is not loaded"):
        loaded.runner.execute(Step(1, [AddedRequest(99, np.array([1, 2], np.int32), 2, GREEDY, lora_id=10)], *(np.zeros(0, np.int32),) * 6,
                                   np.zeros(0, np.uint8)))
    runner = _worker(base_dir, max_loras=2, max_lora_rank=8).runner
    sim = EngineSim(runner, BLOCK, NUM_BLOCKS, token_budget=9)
    sim.pending_lora = LoraWork(loads, np.zeros(0, np.int32))
    requests = [SimRequest(i, prompts[2], NEW_TOKENS, GREEDY, arrive_step=1, lora_id=i) for i in range(3)]
    sim.run(requests)
    assert sim.results[0].lora_load_failed.tolist() == [10 + i for i in range(len(bad))]
    assert [r.output for r in requests] == [expected[""][2], expected["a1"][2], expected["a2"][2]]


def _step(step_id, added=(), removed=(), rows=(), blocks=(), lora=None):
    """rows: (req_id, num_new, num_computed, new_block_count, sample)."""
    i32 = lambda *v: np.array(v, np.int32)  # noqa: E731
    cols = list(zip(*rows)) or [(), (), (), (), ()]
    return Step(step_id, list(added), i32(*removed), i32(*cols[0]), i32(*cols[1]), i32(*cols[2]), i32(*cols[3]),
                i32(*blocks), np.array(cols[4], np.uint8), lora=lora)


def _added(req_id, lora_id, tokens=(1, 2, 3)):
    return AddedRequest(req_id, np.array(tokens, np.int32), len(tokens), GREEDY, lora_id=lora_id)


def test_protocol_errors(case):
    base_dir, loras, _, _ = case
    work = lambda loads=(), unloads=(): LoraWork(list(loads), np.array(unloads, np.int32))  # noqa: E731
    load = lambda i, name: LoraLoad(i, name, str(loras[name]))  # noqa: E731

    runner = _worker(base_dir, max_loras=2).runner
    runner.execute(_step(0, lora=work([load(1, "a1"), load(2, "a2"), load(3, "a3")])))
    runner.execute(_step(1, [_added(1, 1)], rows=[(1, 3, 0, 1, 1)], blocks=[0]))
    with pytest.raises(ProtocolError, match=r"^Step\.lora\.unloads\[0\]: adapter 1 is used by 1 live request"):
        runner.execute(_step(2, lora=work(unloads=[1])))
    # Removed first, unloaded in a later step (LoRA work comes before the step's removals); then unknown.
    runner.execute(_step(3, removed=[1]))
    runner.execute(_step(4, lora=work(unloads=[1, 77])))  # an unknown id is ignored
    with pytest.raises(ProtocolError, match=r"^Step\.added\[0\]\.lora_id: adapter 1 is not loaded"):
        runner.execute(_step(5, [_added(2, 1)]))

    runner = _worker(base_dir, max_loras=2).runner
    runner.execute(_step(0, lora=work([load(1, "a1"), load(2, "a2"), load(3, "a3")])))
    added = [_added(1, 1), _added(2, 2), _added(3, 3), _added(4, 0)]
    rows = [(1, 3, 0, 1, 1), (2, 3, 0, 1, 1), (4, 3, 0, 1, 1)]
    runner.execute(_step(1, added, rows=rows, blocks=[0, 1, 2]))  # two adapters and the base: fine
    with pytest.raises(ProtocolError, match=r"^Step\.req_ids: rows use 3 adapters \(1, 2, 3\), more than --max-loras 2"):
        runner.execute(_step(2, rows=[(1, 1, 3, 1, 1), (2, 1, 3, 1, 1), (3, 3, 0, 1, 1)], blocks=[3, 4, 5]))
    with pytest.raises(ProtocolError, match=r"^Step\.lora\.loads\[0\]\.lora_id: adapter 2 is already loaded"):
        runner.execute(_step(3, lora=work([load(2, "a2")])))
    with pytest.raises(ProtocolError, match=r"^Step\.lora\.loads\[0\]\.lora_id: 0 is not an adapter id"):
        runner.execute(_step(4, lora=work([load(0, "a2")])))

    off = _worker(base_dir, max_loras=0)
    with pytest.raises(ProtocolError, match=r"^Step\.lora: this worker serves no LoRA adapters \(--max-loras 0\)"):
        off.graph_runner.execute(_step(0, lora=work([load(1, "a1")])))
    with pytest.raises(ProtocolError, match=r"^Step\.added\[0\]\.lora_id: this worker serves no LoRA adapters \(--max-loras 0\)"):
        off.runner.execute(_step(0, [_added(1, 1)]))


def test_encoder_runner_refuses_lora():
    from baton_worker.runtime.encoder_runner import EncoderRunner

    runner = EncoderRunner(None, None, 512, torch.device("cpu"))
    with pytest.raises(ProtocolError, match=r"^Step\.lora: an encoder"):
        runner.execute(_step(0, lora=LoraWork([], np.zeros(0, np.int32))))
    with pytest.raises(ProtocolError, match=r"^Step\.added\[0\]\.lora_id: an encoder"):
        runner.execute(_step(0, [_added(1, 2)]))


def test_loading_refuses_what_lora_does_not_apply_to(case, tmp_path):
    base_dir, _, _, _ = case
    with pytest.raises(ConfigError, match=r"^--max-loras 2: .* not a pooling model \(--runner pooling\)"):
        _worker(base_dir, max_loras=2, runner="pooling")
    with pytest.raises(ConfigError, match=r"not --tensor-parallel-size above 1"):
        _worker(base_dir, max_loras=2, tensor_parallel_size=2)
    graph = tmp_path / "graph"
    graph.mkdir()
    (graph / "config.json").write_text(json.dumps({"architectures": ["BatonDemoTTS"]}))
    with pytest.raises(ConfigError, match=r"not BatonDemoTTS, a graph model"):
        _worker(graph, max_loras=2)
    # LoRA on: no decode graphs (they would replay without the adapters); the dummy-null format checks loads only.
    assert _worker(base_dir, max_loras=1).runner.graphs is None
    dummy = _worker(base_dir, max_loras=1, load_format="dummy-null").runner
    result = dummy.execute(_step(0, [_added(1, 1)], rows=[(1, 3, 0, 1, 1)], blocks=[0],
                                 lora=LoraWork([LoraLoad(1, "a1", str(case[1]["a1"]))], np.zeros(0, np.int32))))
    assert len(result.lora_load_failed) == 0 and dummy.lora.adapters[1].weights == [{}, {}]


def test_options():
    base = ["--model", "m", "--in-endpoint", "a", "--out-endpoint", "b", "--block-size", "4"]
    opts = parse_options(base)
    assert (opts.max_loras, opts.max_lora_rank) == (0, 16)
    opts = parse_options(base + ["--max-loras", "4", "--max-lora-rank", "320"])
    assert (opts.max_loras, opts.max_lora_rank) == (4, 320)
    with pytest.raises(OptionsError, match=r"--max-loras must be >= 0"):
        parse_options(base + ["--max-loras", "-1"])
    with pytest.raises(OptionsError, match=r"--max-lora-rank must be positive"):
        parse_options(base + ["--max-lora-rank", "0"])


def test_layout_and_batch_segments():
    """Segments: contiguous runs become views, scattered tokens an index; base tokens are in none."""
    from baton_worker.model.config import RopeConfig, ModelConfig

    config = ModelConfig("LlamaForCausalLM", 512, 8, 12, 1, 2, 1, 4, 1e-6, 64, False, False, False, False, False, RopeConfig())
    layout = LoraLayout.of(config)
    assert layout.bounds(0) == [0, 8, 12, 16] and layout.bounds(2) == [0, 12, 24] and layout.in_features(3) == 12
    present = np.ones((1, 4), bool)

    class Adapter:
        def __init__(self, lora_id):
            self.lora_id, self.present = lora_id, present

        def grouped(self, _layout):
            return [[None] * 4]

    batch = LoraBatch.build(np.array([0, 2, 2, 1, 0, 1, 2], np.int32), {1: Adapter(1), 2: Adapter(2)}, layout, torch.device("cpu"))
    (_, first), (_, second) = batch.segments
    assert first.tolist() == [3, 5] and second.tolist() == [1, 2, 6]
    batch = LoraBatch.build(np.array([0, 1, 1, 0], np.int32), {1: Adapter(1)}, layout, torch.device("cpu"))
    assert batch.segments[0][1] == slice(1, 3)
    assert LoraBatch.build(np.zeros(5, np.int32), {}, layout, torch.device("cpu")) is None


def test_reference_cli(case, tmp_path, capsys):
    base_dir, loras, prompts, expected = case
    out = tmp_path / "out.json"
    args = ["--base", str(base_dir), "--reference", "--lora", str(loras["a3"]), "--prompts", json.dumps(prompts[:1]),
            "--max-new-tokens", "5", "--output", str(out)]
    assert random_loras.main(args) == 0
    assert json.loads(out.read_text()) == {"outputs": [expected["a3"][0][:5]]}
    # The TypeScript e2e test's form: adapters listed in the input file, null for the base model.
    spec = tmp_path / "in.json"
    spec.write_text(json.dumps({"prompts": prompts[:2], "max_new_tokens": 4, "loras": [None, str(loras["a1"])]}))
    assert random_loras.main(["--base", str(base_dir), "--reference", "--input", str(spec)]) == 0
    got = json.loads(capsys.readouterr().out.strip().split("\n")[-1])["outputs"]
    assert got == [[out[:4] for out in expected[name][:2]] for name in ("", "a1")]
