#!/usr/bin/env bash
# Baton's GPU check, in one call of at most 8 minutes on a lent GPU machine
# (which has python3 with CUDA torch, Triton and transformers; nothing to install).
# Run from the repository root:   bash bench/gpu/run.sh
# Logs go to $OUT (or ./gpu-out); the summary is printed last.
#   1. the Triton attention kernels, compiled, against the reference backend
#   2. greedy parity with transformers on CUDA: five architectures in float32
#      (exact), the Triton path with static decode inputs, bfloat16 agreement
#   3. bench/gpu_decode.py on Llama-3-8B's shape (bf16, random weights):
#      decode ms/step for B = 1..256 against the roofline, with CUDA graphs and
#      eagerly, one 2,048-token prefill, and the GPU's busy fraction at B=1
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
py="${BATON_PYTHON:-python3}"
summary="$out/summary.txt"
: >"$summary"

say() { echo "$*" | tee -a "$summary"; }

say "== device"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$summary"
"$py" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$summary"

say "== kernels and parity (pytest)"
timeout 150 "$py" -m pytest -q -p no:cacheprovider python/tests/test_triton_attention.py python/tests/test_parity.py \
  >"$out/pytest.log" 2>&1
say "pytest exit $?: $(tail -n 1 "$out/pytest.log")"
grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -n 20 | tee -a "$summary"

say "== decode, CUDA graphs (default path)"
timeout 180 "$py" bench/gpu_decode.py --preset llama3-8b --batch 1 8 32 64 128 256 --prefill-len 2048 --profile \
  --trace "$out/trace.json" --json "$out/decode-graphs.json" >"$out/decode-graphs.log" 2>&1
say "exit $?"
grep -vE "UserWarning|_warn_once" "$out/decode-graphs.log" | tail -n 14 | tee -a "$summary"

say "== decode, eager (--enforce-eager)"
timeout 90 "$py" bench/gpu_decode.py --preset llama3-8b --batch 1 128 --enforce-eager --json "$out/decode-eager.json" \
  >"$out/decode-eager.log" 2>&1
say "exit $?"
tail -n 6 "$out/decode-eager.log" | tee -a "$summary"
rm -f "$out/trace.json"
