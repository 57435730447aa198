"""transformers' own decode on the same shape as bench/gpu_decode.py: the peer
Baton is compared with on one GPU.

A random-weight LlamaForCausalLM of --preset's shape (bf16) built on the
device; for each batch size B, B random prompts of --prompt-len tokens go
through `generate` (greedy, KV cache, eager: no compile, no CUDA graphs) twice,
for 4 and for 4 + --steps new tokens; the difference over --steps is its
decode ms/step (prefill and set-up cancel out).

  python3 bench/gpu/hf_peer.py --batch 1 8 32 128 256             # on a GPU
  python3 bench/gpu/hf_peer.py --preset tiny --batch 1 2 --steps 4  # anywhere
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from gpu_decode import PRESETS  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="llama3-8b")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 128, 256])
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = dict(PRESETS[args.preset])
    theta = shape.pop("rope_theta")
    config = LlamaConfig(**shape, rope_theta=theta, rms_norm_eps=1e-5, attention_bias=False, mlp_bias=False)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
    print(f"transformers {args.preset} ({dtype}, random weights) on {device}: built in {time.perf_counter() - t0:.1f} s", flush=True)

    def generate(batch: int, new: int) -> float:
        ids = torch.randint(0, config.vocab_size, (batch, args.prompt_len), device=device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           pad_token_id=0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    generate(args.batch[0], 2)  # warm-up
    print(f"{'B':>5} {'ms/step':>9} {'tok/s':>10}")
    for batch in args.batch:
        short, long = generate(batch, 4), generate(batch, 4 + args.steps)
        ms = (long - short) / args.steps * 1e3
        print(f"{batch:>5} {ms:>9.3f} {batch / ms * 1e3:>10.1f}", flush=True)


if __name__ == "__main__":
    main()
