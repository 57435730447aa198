"""Tensor parallel on CPU (gloo): the split rules, the parallel layers in a real
2-process group, and greedy parity of TP=2 with TP=1 on every supported
architecture, through the same Step path the server uses (EngineSim).

The ranks are real processes (tp_layers.py, tp_sim.py) that meet at a
TCPStore this test hosts, as the worker's ranks meet at rank 0's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from baton_worker.model.config import ConfigError
from baton_worker.parallel.tensor_parallel import Partition, check_tensor_parallel
from random_models import make_model_dir
from tp_layers import config as small_config

HERE = Path(__file__).resolve().parent
RANK_TIMEOUT_S = 120


def _run_ranks(script: str, size: int, out: Path, *args: str, env: dict | None = None) -> None:
    """Runs `size` ranks of a script (size 1: one process, no group) and checks they all exit 0."""
    store = dist.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False) if size > 1 else None
    port = str(store.port) if store is not None else "0"
    procs = [
        subprocess.Popen([sys.executable, str(HERE / script), str(rank), str(size), port, str(out), *args], env=env)
        for rank in range(size)
    ]
    try:
        codes = [p.wait(RANK_TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [0] * size


# ---------------------------------------------------------------- split rules


def test_partition_splits_heads_and_pads_the_vocabulary():
    c = small_config()  # 4 heads, 2 kv heads, intermediate 24, vocabulary 37
    parts = [Partition.of(c, r, 2) for r in range(2)]
    assert [p.q_heads for p in parts] == [(0, 2), (2, 4)]
    assert [p.kv_heads for p in parts] == [(0, 1), (1, 2)]
    assert [p.intermediate for p in parts] == [(0, 12), (12, 24)]
    assert [p.vocab for p in parts] == [(0, 19), (19, 38)]  # the last shard has one padding row
    local = parts[1].local_config(c)
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size, local.vocab_size) == (2, 1, 12, 37)


def test_fewer_kv_heads_than_ranks_are_replicated():
    from dataclasses import replace

    c = replace(small_config(), num_kv_heads=1)
    assert [Partition.of(c, r, 2).kv_heads for r in range(2)] == [(0, 1), (0, 1)]
    c = replace(small_config(), num_heads=8, num_kv_heads=2)
    # 4 ranks, 2 kv heads: ranks 0-1 read head 0 (their q heads 0-3), ranks 2-3 head 1.
    assert [Partition.of(c, r, 4).kv_heads for r in range(4)] == [(0, 1), (0, 1), (1, 2), (1, 2)]


def test_sizes_that_do_not_split_are_refused_with_the_reason():
    from dataclasses import replace

    c = small_config()
    with pytest.raises(ConfigError, match="--tensor-parallel-size 3 must divide the model's 4 attention heads"):
        check_tensor_parallel(c, 3)
    with pytest.raises(ConfigError, match="key/value heads"):
        check_tensor_parallel(replace(c, num_heads=6, num_kv_heads=3, intermediate_size=24), 2)
    with pytest.raises(ConfigError, match="intermediate_size"):
        check_tensor_parallel(replace(c, intermediate_size=25), 2)
    check_tensor_parallel(c, 1)
    check_tensor_parallel(c, 4)  # 2 kv heads, each on 2 ranks


# ---------------------------------------------------------------- layers in a gloo group


def test_parallel_layers_match_the_unsharded_computation(tmp_path):
    _run_ranks("tp_layers.py", 2, tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for checks in ranks:
        assert checks["embed"] == 0.0  # exact: one rank contributes each row, the other zeros
        # Not bit-exact: a GEMM over fewer output rows may block (and so sum) differently,
        # and an all-reduce adds the partial sums in another order.
        assert checks["q_proj"] < 1e-5
        assert checks["o_proj"] < 1e-5 and checks["down_proj"] < 1e-5
        assert checks["bytes"] == 0.0 and checks["tokens"] == 0.0
        assert checks["after_idle"] == 0.0  # waiting for a Step outlasts the collectives' timeout
    assert ranks[0]["lm_head"] < 1e-5
    assert [r["kv_heads"] for r in ranks] == [[0, 1], [1, 2]]
    assert [r["vocab"] for r in ranks] == [[0, 19], [19, 38]]


# ---------------------------------------------------------------- greedy parity with TP=1

# (arch, variant, block_size, token budget per step, prompt logprobs): together
# they cover split KV heads (4/2, 6/2, 8/8), replicated ones (4/1), tied and
# untied embeddings, q/k/v bias, q/k norm, sliding windows, llama3 rope, and a
# sharded checkpoint.
PARITY = [
    ("llama", 0, 4, 7, -1),
    ("llama3", 2, 8, 9, -1),
    ("mistral", 0, 4, 6, -1),
    ("qwen2", 3, 8, 5, -1),
    ("qwen2", 1, 4, 6, -1),
    ("qwen3", 1, 4, 6, 3),
]


def test_tp2_greedy_output_equals_tp1_on_every_architecture(tmp_path):
    specs = []
    for arch, variant, block, budget, prompt_k in PARITY:
        model_dir = make_model_dir(arch, tmp_path / f"{arch}-{variant}", variant)
        specs.append(f"{model_dir}:{block}:{budget}:{prompt_k}")
    one, two = tmp_path / "tp1.json", tmp_path / "tp2.json"
    _run_ranks("tp_sim.py", 1, one, *specs)
    _run_ranks("tp_sim.py", 2, two, *specs)
    tp1, tp2 = json.loads(one.read_text()), json.loads(two.read_text())
    report = []
    for (arch, variant, *_), spec in zip(PARITY, specs):
        key = spec.rsplit(":", 3)[0]
        a, b = tp1[key], tp2[key]
        # TP=1 decides plain greedy rows with the head's screen, so its sampler may see none.
        report.append(f"{arch}-v{variant}: min top-2 gap {a['min_margin']} (tp1) {b['min_margin']} (tp2)")
        assert b["outputs"] == a["outputs"], f"{arch} v{variant}: TP=2 output differs from TP=1"
        for lp1, lp2 in zip(a["prompt_logprobs"], b["prompt_logprobs"]):
            assert lp2 == pytest.approx(lp1, abs=1e-4)
    print("\n".join(report))
    assert any(tp1[s.rsplit(":", 3)[0]]["prompt_logprobs"][-1] for s in specs)  # the prompt-logprob path ran


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL tensor parallel needs two GPUs")
def test_tp2_on_nccl_equals_tp1_on_cuda(tmp_path):
    """The CUDA path: NCCL for the model's collectives, gloo for the Step bytes and sampled ids."""
    model_dir = make_model_dir("qwen3", tmp_path / "qwen3", 0)
    spec = f"{model_dir}:4:8:-1"
    env = {**os.environ, "BATON_TP_DEVICE": "cuda"}
    _run_ranks("tp_sim.py", 1, tmp_path / "tp1.json", spec, env=env)
    _run_ranks("tp_sim.py", 2, tmp_path / "tp2.json", spec, env=env)
    one, two = (json.loads((tmp_path / f"tp{n}.json").read_text())[str(model_dir)] for n in (1, 2))
    assert two["outputs"] == one["outputs"]
