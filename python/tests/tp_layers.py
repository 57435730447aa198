"""One rank of the parallel-layer checks in test_tensor_parallel.py.

python tp_layers.py RANK SIZE STORE_PORT OUT_DIR

Every rank builds the same full tensors (seeded), takes its shard with
Partition, runs the collective and compares with the unsharded computation;
it writes OUT_DIR/rank<R>.json with each check's largest difference.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from baton_worker.model.config import ModelConfig, RopeConfig  # noqa: E402
from baton_worker.parallel import tensor_parallel as parallel  # noqa: E402
from baton_worker.parallel.tensor_parallel import Partition, TensorParallelGroup  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 16, 4, 2, 4, 24, 37  # vocabulary not a multiple of the ranks


def config() -> ModelConfig:
    return ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_layers=1,
        num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, rms_norm_eps=1e-6, max_position_embeddings=64,
        tie_word_embeddings=False, qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=False,
        rope=RopeConfig(theta=10000.0),
    )


def main() -> None:
    rank, size, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    torch.set_num_threads(1)
    # A short timeout for the forward's collectives, to show that an idle wait
    # for the next Step (longer than it) does not fail.
    parallel.GROUP_TIMEOUT = datetime.timedelta(seconds=2)
    tp = TensorParallelGroup(rank, size, dist.TCPStore("127.0.0.1", port, size, is_master=False), torch.device("cpu"))
    part = Partition.of(config(), rank, size)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, HIDDEN, generator=g)
    embed = torch.randn(VOCAB, HIDDEN, generator=g)
    ids = torch.tensor([0, VOCAB // 2, VOCAB - 1, 3, 3, 20])
    o_proj = torch.randn(HIDDEN, HEADS * HEAD_DIM, generator=g)
    attn_out = torch.randn(5, HEADS * HEAD_DIM, generator=g)
    down = torch.randn(HIDDEN, INTER, generator=g)
    act = torch.randn(5, INTER, generator=g)
    q = torch.randn(HEADS * HEAD_DIM, HIDDEN, generator=g)
    checks = {}
    # Vocabulary-parallel embedding: exact (one rank holds each row, the rest add zeros).
    checks["embed"] = (tp.embed(ids, part.vocab_rows(embed), part) - F.embedding(ids, embed)).abs().max().item()
    # Row-parallel o_proj and down_proj: partial sums all-reduced.
    full = F.linear(attn_out, o_proj)
    cols = slice(part.q_heads[0] * HEAD_DIM, part.q_heads[1] * HEAD_DIM)
    checks["o_proj"] = (tp.all_reduce(F.linear(attn_out[:, cols], part.o_columns(o_proj, HEAD_DIM))) - full).abs().max().item()
    inter = slice(*part.intermediate)
    checks["down_proj"] = (tp.all_reduce(F.linear(act[:, inter], part.down_columns(down))) - F.linear(act, down)).abs().max().item()
    # Column-parallel q: this rank's heads are exactly those rows of the full output.
    checks["q_proj"] = (F.linear(x, part.qkv_rows("q", q, HEAD_DIM)) - F.linear(x, q)[:, cols]).abs().max().item()
    # Vocabulary-parallel lm_head: rank 0 gathers the full logits, padding dropped.
    logits = tp.gather_logits(F.linear(x, part.vocab_rows(embed)), VOCAB)
    if rank == 0:
        assert logits.shape == (5, VOCAB), logits.shape
        checks["lm_head"] = (logits - F.linear(x, embed)).abs().max().item()
    else:
        assert logits is None
    # The Step's bytes and the sampled ids reach every rank unchanged.
    payload = bytes(range(256)) * 3 if rank == 0 else None
    checks["bytes"] = float(tp.broadcast_bytes(payload) != bytes(range(256)) * 3)
    tokens = tp.broadcast_tokens(np.array([7, 1, 36], np.int32) if rank == 0 else None, 3)
    checks["tokens"] = float(tokens.tolist() != [7, 1, 36])
    if rank == 0:
        time.sleep(3)  # the server idles longer than the group timeout
    checks["after_idle"] = float(tp.broadcast_bytes(b"next step" if rank == 0 else None) != b"next step")
    checks["kv_heads"] = list(part.kv_heads)
    checks["vocab"] = list(part.vocab)
    (out / f"rank{rank}.json").write_text(json.dumps(checks))
    tp.close()


if __name__ == "__main__":
    main()
