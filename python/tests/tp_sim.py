"""One tensor-parallel rank driven by EngineSim, for test_tensor_parallel.py.

python tp_sim.py RANK SIZE STORE_PORT OUT.json MODEL_DIR:BLOCK_SIZE:BUDGET:PROMPT_LOGPROBS ...

For each model in turn, every rank runs the same EngineSim (same seed, same
prompts): the Steps agree on every rank as the broadcast from a real rank 0
would make them, and the ranks above 0 get the sampled ids through the group,
as in serving. Rank 0 (or the single process when SIZE is 1) writes, per
model, each request's output ids, its prompt logprobs (PROMPT_LOGPROBS -1:
none), and the smallest top-1/top-2 logit gap of any greedy row it sampled (how
close the run came to a tie) to OUT.json. One process pair serves every model:
starting torch is the slow part.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from baton_worker.runtime.loading import load_worker  # noqa: E402
from baton_worker.runtime.options import WorkerOptions  # noqa: E402
from baton_worker.parallel.tensor_parallel import TensorParallelGroup  # noqa: E402
from baton_worker.protocol import SamplingParams  # noqa: E402
from engine_sim import EngineSim, SimRequest  # noqa: E402

NEW_TOKENS = 16
NUM_BLOCKS = 96


def prompts(vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(n)] for n in (1, 5, 13, 22)]


def run(model_dir: str, block_size: int, budget: int, prompt_k: int, tp: TensorParallelGroup | None, device: str) -> dict:
    opts = WorkerOptions(
        model=model_dir, in_endpoint="", out_endpoint="", block_size=block_size, num_blocks=NUM_BLOCKS, dtype="float32", device=device
    )
    runner = load_worker(opts, tp=tp).runner
    margins: list[float] = []
    sample = runner.sampler.sample

    def recording_sample(logits, states, mask=None):
        top2 = torch.topk(logits, 2, dim=-1).values
        margins.extend((top2[:, 0] - top2[:, 1]).tolist())
        return sample(logits, states, mask)

    runner.sampler.sample = recording_sample
    sim = EngineSim(runner, block_size, NUM_BLOCKS, token_budget=budget, seed=block_size)
    greedy = SamplingParams(temperature=0.0)
    requests = [
        SimRequest(i, p, NEW_TOKENS, greedy, arrive_step=2 * i, prompt_logprobs=prompt_k)
        for i, p in enumerate(prompts(runner.vocab_size, 3))
    ]
    sim.run(requests)
    return {
        "outputs": [r.output for r in requests],
        "prompt_logprobs": [[p[0] for p in r.prompt_results] for r in requests],
        "min_margin": min(margins) if margins else None,
    }


def main() -> None:
    rank, size, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    # BATON_TP_DEVICE=cuda: rank r on GPU r, NCCL for the model's collectives.
    device = os.environ.get("BATON_TP_DEVICE", "cpu")
    if device == "cuda":
        torch.cuda.set_device(rank)
    tp = None
    if size > 1:
        store = dist.TCPStore("127.0.0.1", port, size, is_master=False)
        tp = TensorParallelGroup(rank, size, store, torch.device(device, rank) if device == "cuda" else torch.device("cpu"))
    results = {}
    for spec in sys.argv[5:]:
        model_dir, block_size, budget, prompt_k = spec.rsplit(":", 3)
        results[model_dir] = run(model_dir, int(block_size), int(budget), int(prompt_k), tp, device)
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    if tp is not None:
        tp.close()


if __name__ == "__main__":
    main()
