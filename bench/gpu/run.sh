#!/usr/bin/env bash
# Baton's GPU check: one call of at most 9 minutes on a lent GPU machine (python3
# with CUDA torch, Triton and transformers; no Node, no pyzmq: bench/gpu/pack.sh
# prepares .gpu-carry/ for the served parts). From the repository root:
#   bash bench/gpu/run.sh [PART...]
# With no PART, all of these but kernels, in this order:
#   parity    pytest on CUDA: greedy parity with transformers for five architectures
#             in float32 (exact; CUDA graphs, Triton attention and layer kernels) and
#             the overlapped steps
#   spec      pytest on CUDA: speculative decoding (drafts verified through the decode
#             graphs), then through the server (bench/spec_decode_bench.mjs) on
#             Llama-3-8B's shape: a copying workload (tied embeddings, --model-loader-
#             extra-config residual_scale 0.001: greedy output repeats the prompt's last
#             token, so n-gram drafts are accepted) and the plain random model
#   lora      pytest on CUDA: multi-LoRA (the Triton shrink/expand kernels) against PEFT
#   decode    bench/gpu_decode.py on Llama-3-8B's shape (bf16, random weights): decode
#             ms/step for B = 1..256 against the roofline (measured copy bandwidth), one
#             2,048-token prefill
#   serve     the whole server (bench/gpu/serve.sh) at concurrency 1 and 32
#   kernels   the attention kernels alone for several tile and warp settings
# The served parts need .gpu-carry/ (serve.sh unpacks it; spec runs it first when
# serve did not). Logs go to $OUT (or ./gpu-out); summary.txt holds what is printed.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
py="${BATON_PYTHON:-python3}"
summary="$out/summary.txt"
: >"$summary"
work=${BATON_GPU_WORK:-/tmp/baton-gpu}
shape=${BATON_GPU_SERVE_SHAPE:-llama3-8b}
device=${BATON_GPU_SERVE_DEVICE:-cuda}
dtype=${BATON_GPU_SERVE_DTYPE:-bfloat16}

say() { echo "$*" | tee -a "$summary"; }

# pytest_part NAME SECONDS TESTS...: one pytest run, each test's outcome and the slowest in $out/pytest-NAME.log.
pytest_part() {
  local name=$1 limit=$2 log="$out/pytest-$1.log"
  shift 2
  timeout "$limit" "$py" -m pytest -v -p no:cacheprovider --durations=8 "$@" >"$log" 2>&1
  local rc=$?
  say "pytest $name exit $rc: $(grep -E '(passed|failed)' "$log" | tail -n 1)"
  grep -E "(FAILED|ERROR)" "$log" | grep -v "^=" | head -n 20 | tee -a "$summary"
  [ $rc -ne 124 ] || say "timed out at: $(grep -E '::' "$log" | tail -n 1)"
}

part_parity() {
  say "== parity (pytest, CUDA)"
  pytest_part parity 150 python/tests/test_parity.py python/tests/test_overlap.py
}

part_decode() {
  say "== decode: CUDA graphs, overlapped steps (the default path)"
  timeout 80 "$py" bench/gpu_decode.py --preset llama3-8b --batch 1 8 32 64 128 256 --prefill-len 2048 \
    --json "$out/decode.json" >"$out/decode.log" 2>&1
  say "exit $?"
  grep -vE "UserWarning|_warn_once|USDT|profiler_st" "$out/decode.log" | tail -n 40 | tee -a "$summary"
}

serve_levels() {  # serve_levels LEVELS PROMPTS LIMIT
  [ -d .gpu-carry ] || { say "serve: no .gpu-carry (bash bench/gpu/pack.sh, and name it in the call's carry)"; return 1; }
  BATON_GPU_SERVE_LEVELS=$1 BATON_GPU_SERVE_PROMPTS=$2 timeout "$3" bash bench/gpu/serve.sh >"$out/serve.log" 2>&1
  local rc=$?
  say "exit $rc"
  tail -n 12 "$out/serve.log" | tee -a "$summary"
  return $rc
}

part_serve() {
  say "== served: baton serve + baton bench serve"
  serve_levels "${BATON_GPU_SERVE_LEVELS:-1 32}" "${BATON_GPU_SERVE_PROMPTS:-12 96}" 130
}

part_spec() {
  say "== speculative decoding (pytest, CUDA)"
  pytest_part spec 90 python/tests/test_spec_decode.py
  local model=$work/model-$shape
  if [ ! -x "$work/bin/node" ] || [ ! -f "$model/config.json" ]; then
    say "== served (to unpack the carry and write the model directory)"
    serve_levels 1 4 90 || return
  fi
  local copying=$model-copying
  rm -rf "$copying" && cp -r "$model" "$copying"
  "$py" -c 'import json, sys; p = sys.argv[1] + "/config.json"; c = json.load(open(p)); c["tie_word_embeddings"] = True; json.dump(c, open(p, "w"))' "$copying"
  local dir extra
  for dir in "$copying" "$model"; do
    extra=()
    [ "$dir" = "$copying" ] && extra=(--model-loader-extra-config '{"residual_scale": 0.001}')
    say "== speculative decoding through the server, n-gram K=4: $(basename "$dir")"
    PATH="$work/bin:$PATH" PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}" BATON_PYTHON=$py timeout 150 \
      node bench/spec_decode_bench.mjs "$dir" 4 8 128 -- --load-format dummy --device "$device" --dtype "$dtype" "${extra[@]}" \
      >"$out/spec-$(basename "$dir").log" 2>&1
    say "exit $?"
    tail -n 7 "$out/spec-$(basename "$dir").log" | tee -a "$summary"
  done
}

part_lora() {
  say "== multi-LoRA (pytest, CUDA)"
  pytest_part lora 150 python/tests/test_lora.py
}

part_kernels() {
  say "== attention kernels alone"
  timeout 50 "$py" bench/gpu/attention_kernels.py >"$out/kernels.log" 2>&1
  say "exit $?"
  grep -E "best|prefill|copy bandwidth" "$out/kernels.log" | tee -a "$summary"
}

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(parity spec lora decode serve)
say "== device"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$summary"
"$py" -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$summary"
for part in "${parts[@]}"; do
  declare -F "part_$part" >/dev/null || { say "unknown part $part (parity spec lora decode serve kernels)"; continue; }
  "part_$part"
done
