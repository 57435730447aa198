#!/usr/bin/env bash
# Baton's GPU check: one call of at most 8 minutes on a lent GPU machine (python3
# with CUDA torch, Triton and transformers; no Node, no pyzmq: bench/gpu/pack.sh
# prepares .gpu-carry/ for the served part). From the repository root:
#   bash bench/gpu/run.sh
# Logs go to $OUT (or ./gpu-out); summary.txt holds what is printed.
#   1. pytest on CUDA: greedy parity with transformers for five architectures in
#      float32 (exact; CUDA graphs, Triton attention and layer kernels), the
#      overlapped steps, bfloat16 agreement, the layer kernels (bf16 too) and a
#      sample of the attention kernel tests
#   2. bench/gpu_decode.py on Llama-3-8B's shape (bf16, random weights): decode
#      ms/step for B = 1..256 against the roofline (measured copy bandwidth), one
#      2,048-token prefill, the GPU's busy fraction and top kernels at B=1 and 128
#   3. the whole server (bench/gpu/serve.sh, when .gpu-carry/ came along)
#   4. the attention kernels alone for several tile and warp settings
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

say "== parity and kernels (pytest, CUDA)"
timeout 140 "$py" -m pytest -q -p no:cacheprovider python/tests/test_parity.py python/tests/test_overlap.py \
  python/tests/test_layer_ops.py python/tests/test_triton_attention.py -k "not test_mixed_step or None-4-16 or 40-8-32" \
  >"$out/pytest.log" 2>&1
say "pytest exit $?: $(grep -E '(passed|failed)' "$out/pytest.log" | tail -n 1)"
grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head -n 20 | tee -a "$summary"

say "== decode: CUDA graphs, overlapped steps (the default path)"
timeout 110 "$py" bench/gpu_decode.py --preset llama3-8b --batch 1 8 32 64 128 256 --prefill-len 2048 --profile 1 128 \
  --trace "$out/trace.json" --json "$out/decode.json" >"$out/decode.log" 2>&1
say "exit $?"
grep -vE "UserWarning|_warn_once|USDT|profiler_st" "$out/decode.log" | tail -n 40 | tee -a "$summary"
rm -f "$out"/trace*.json

if [ -d .gpu-carry ] && [ -f bench/gpu/serve.sh ]; then
  say "== served: baton serve + baton bench serve"
  timeout 170 bash bench/gpu/serve.sh >"$out/serve.log" 2>&1
  say "exit $?"
  tail -n 12 "$out/serve.log" | tee -a "$summary"
fi

say "== attention kernels alone"
timeout 50 "$py" bench/gpu/attention_kernels.py >"$out/kernels.log" 2>&1
say "exit $?"
grep -E "best|prefill|copy bandwidth" "$out/kernels.log" | tee -a "$summary"
