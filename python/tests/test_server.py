"""The real worker process over real ZeroMQ ipc sockets: handshake, steps,
Ping/Pong, Shutdown, and Fatal + exit 1 on every kind of failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zmq

from baton_worker import protocol
from baton_worker.protocol import AddedRequest, SamplingParams, Step
from random_models import make_model_dir

PYTHON_DIR = Path(__file__).resolve().parents[1]
TIMEOUT_MS = 60_000


class Engine:
    """The engine's side of the sockets, plus the spawned worker."""

    def __init__(self, tmp: Path, args: list[str], env: dict[str, str] | None = None):
        self.context = zmq.Context()
        self.push = self.context.socket(zmq.PUSH)
        self.pull = self.context.socket(zmq.PULL)
        self.push.setsockopt(zmq.LINGER, 0)
        self.pull.setsockopt(zmq.LINGER, 0)
        tmp.mkdir(parents=True, exist_ok=True)
        in_ep, out_ep = f"ipc://{tmp}/in.sock", f"ipc://{tmp}/out.sock"
        self.push.bind(in_ep)
        self.pull.bind(out_ep)
        env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), **(env or {}))
        cmd = [sys.executable, "-m", "baton_worker", "--in-endpoint", in_ep, "--out-endpoint", out_ep, *args]
        self.proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)

    def recv(self):
        if not self.pull.poll(TIMEOUT_MS):
            raise TimeoutError("no message from the worker")
        return protocol.decode(self.pull.recv())

    def send(self, message) -> None:
        self.push.send(protocol.encode(message))

    def wait(self) -> tuple[int, str]:
        _, stderr = self.proc.communicate(timeout=TIMEOUT_MS / 1000)
        return self.proc.returncode, stderr

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.push.close()
        self.pull.close()
        self.context.term()


@pytest.fixture
def spawn(tmp_path):
    engines = []

    def start(*args: str, env: dict[str, str] | None = None) -> Engine:
        engine = Engine(tmp_path / str(len(engines)), list(args), env)
        engines.append(engine)
        return engine

    yield start
    for engine in engines:
        engine.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir("llama", tmp_path_factory.mktemp("model") / "llama", variant=3)


def _step(step_id, added, req_ids, new, computed, counts, blocks, sample):
    i32 = lambda v: np.array(v, np.int32)  # noqa: E731
    return Step(step_id, added, i32([]), i32(req_ids), i32(new), i32(computed), i32(counts), i32(blocks), np.array(sample, np.uint8))


def test_ready_step_ping_shutdown(spawn, model_dir):
    engine = spawn("--model", str(model_dir), "--block-size", "4", "--num-blocks", "32", "--seed", "3", "--dtype", "float32")
    ready = engine.recv()
    assert isinstance(ready, protocol.Ready), ready
    assert (ready.protocol_version, ready.num_blocks, ready.block_size) == (protocol.PROTOCOL_VERSION, 32, 4)
    assert ready.max_model_len == 128  # capped to 32 blocks * 4 tokens (config says 512)
    assert (ready.vocab_size, ready.architecture, ready.dtype, ready.device) == (512, "LlamaForCausalLM", "float32", "cpu")
    assert ready.worker_pid == engine.proc.pid
    # A plain LLM directory is served as the one-node graph; its decode loop is capped by the context length.
    assert [n["name"] for n in ready.graph["nodes"]] == ["llm"]
    assert [w["name"] for w in ready.graph["walks"]] == ["prefill", "decode"]
    assert [s["max_iters"] for s in ready.graph["sections"] if s["kind"] == "loop"] == [128]

    prompt = np.array([3, 1, 4, 1, 5, 9], np.int32)
    added = AddedRequest(11, prompt, 6, SamplingParams(temperature=0.0, logprobs=1))
    engine.send(_step(0, [added], [11], [6], [0], [2], [7, 2], [1]))
    result = engine.recv()
    assert isinstance(result, protocol.StepResult)
    assert result.step_id == 0 and result.req_ids.tolist() == [11] and len(result.token_ids) == 1
    assert result.logprobs is not None and result.top_counts.tolist() == [1]
    assert result.top_ids[0] == result.token_ids[0]  # greedy picks the top raw logprob
    assert result.timings.forward_ms > 0

    engine.send(_step(1, [], [11], [1], [6], [0], [], [1]))  # decode
    assert engine.recv().step_id == 1

    engine.send(protocol.Ping(77))
    assert engine.recv() == protocol.Pong(77)
    engine.send(protocol.Shutdown())
    code, stderr = engine.wait()
    assert code == 0, stderr


def test_overlapped_steps_answer_in_order_with_the_same_tokens(spawn, model_dir):
    """The engine sends step N+1 before it has N's result. A worker that
    overlaps (a GPU worker; BATON_TEST_OVERLAP=1 here) launches N+1, whose row
    reads the token sampled at N on the device, before it answers N; results
    come in step order, a Ping is answered meanwhile, and the tokens are those
    of a worker that runs one step at a time."""

    def run(overlap: bool) -> list[int]:
        env = {"BATON_TEST_OVERLAP": "1"} if overlap else None
        engine = spawn("--model", str(model_dir), "--block-size", "4", "--num-blocks", "32", "--dtype", "float32", env=env)
        assert isinstance(engine.recv(), protocol.Ready)
        added = AddedRequest(5, np.array([3, 1, 4, 1, 5, 9], np.int32), 6, SamplingParams(temperature=0.0))
        steps = [_step(0, [added], [5], [6], [0], [2], [7, 2], [1])]
        steps += [_step(i, [], [5], [1], [5 + i], [1] if 5 + i == 8 else [0], [4] if 5 + i == 8 else [], [1]) for i in range(1, 6)]
        tokens, sent = [], 0
        for _ in range(2):
            engine.send(steps[sent])
            sent += 1
        engine.send(protocol.Ping(9))
        replies = []
        while len(tokens) < len(steps):
            reply = engine.recv()
            replies.append(reply)
            if isinstance(reply, protocol.StepResult):
                assert reply.step_id == len(tokens)
                tokens += reply.token_ids.tolist()
                if sent < len(steps):
                    engine.send(steps[sent])
                    sent += 1
        assert protocol.Pong(9) in replies
        engine.send(protocol.Shutdown())
        code, stderr = engine.wait()
        assert code == 0, stderr
        return tokens

    assert run(True) == run(False)


def test_dummy_null_needs_no_weights(spawn, tmp_path):
    model = tmp_path / "dummy"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "vocab_size": 1000}))
    engine = spawn("--model", str(model), "--block-size", "16", "--load-format", "dummy-null")
    ready = engine.recv()
    assert isinstance(ready, protocol.Ready) and ready.vocab_size == 1000
    added = AddedRequest(1, np.array([5, 999], np.int32), 2, SamplingParams())
    engine.send(_step(0, [added], [1], [2], [0], [1], [0], [1]))
    assert engine.recv().token_ids.tolist() == [0]  # (999 + 1) % 1000
    engine.send(protocol.Shutdown())
    assert engine.wait()[0] == 0


def _expect_fatal(engine: Engine, needle: str) -> str:
    message = engine.recv()
    assert isinstance(message, protocol.Fatal), message
    assert needle in message.message, message.message
    code, stderr = engine.wait()
    assert code == 1
    assert message.message in stderr
    assert "Traceback" not in stderr
    return message.message


def test_missing_model_dir(spawn, tmp_path):
    engine = spawn("--model", str(tmp_path / "nope"), "--block-size", "16")
    _expect_fatal(engine, f"model directory {tmp_path / 'nope'} does not exist")


def test_unknown_architecture(spawn, tmp_path):
    model = tmp_path / "gpt2"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "vocab_size": 10}))
    text = _expect_fatal(spawn("--model", str(model), "--block-size", "16"), "unsupported architecture 'GPT2LMHeadModel'")
    assert "Qwen3ForCausalLM" in text


def test_bad_dtype(spawn, model_dir):
    _expect_fatal(spawn("--model", str(model_dir), "--block-size", "16", "--dtype", "float8"), "unsupported --dtype 'float8'")


def test_bad_attention_backend(spawn, model_dir):
    _expect_fatal(
        spawn("--model", str(model_dir), "--block-size", "16", "--attention-backend", "fast"),
        "unsupported --attention-backend 'fast'; supported: auto, reference, cpu, triton, flex",
    )


def test_missing_weights(spawn, tmp_path, model_dir):
    model = tmp_path / "noweights"
    model.mkdir()
    (model / "config.json").write_bytes((model_dir / "config.json").read_bytes())
    _expect_fatal(spawn("--model", str(model), "--block-size", "16"), "no *.safetensors weights")


def test_max_model_len_too_large_for_cache(spawn, model_dir):
    engine = spawn("--model", str(model_dir), "--block-size", "4", "--num-blocks", "8", "--max-model-len", "64")
    _expect_fatal(engine, "--max-model-len 64 needs 16 KV blocks but the cache has 8")


def test_malformed_step_is_fatal_naming_the_field(spawn, model_dir):
    engine = spawn("--model", str(model_dir), "--block-size", "4", "--num-blocks", "8")
    assert isinstance(engine.recv(), protocol.Ready)
    wire = protocol.to_wire(_step(0, [], [], [], [], [], [], []))
    wire[1] = "zero"
    import msgpack

    engine.push.send(msgpack.packb(wire, use_bin_type=True))
    _expect_fatal(engine, "Step.step_id: expected int, got str")


def test_inconsistent_step_is_fatal(spawn, model_dir):
    engine = spawn("--model", str(model_dir), "--block-size", "4", "--num-blocks", "8")
    assert isinstance(engine.recv(), protocol.Ready)
    engine.send(_step(0, [], [42], [1], [0], [0], [], [1]))
    _expect_fatal(engine, "Step.req_ids[0]: unknown request 42")


@pytest.mark.parametrize("host_workers,tp", [(1, 1), (2, 1), (3, 2), (64, 1)])
def test_worker_processes_on_one_host_share_its_cores(host_workers, tp):
    # Each worker takes cores / (host workers x TP ranks) torch threads, at least 1 (OMP_NUM_THREADS unset).
    code = (
        "from baton_worker.runtime.options import parse_options; from baton_worker.runtime.server import set_cpu_threads; "
        f"print(set_cpu_threads(parse_options(['--model', 'm', '--in-endpoint', 'ipc://a', '--out-endpoint', 'ipc://b', '--block-size', '16', "
        f"'--host-workers', '{host_workers}', '--tensor-parallel-size', '{tp}'])))"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(PYTHON_DIR)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    cores = len(os.sched_getaffinity(0))
    assert int(out) == max(1, cores // (host_workers * tp))


def test_host_workers_must_be_positive():
    from baton_worker.runtime.options import OptionsError, parse_options

    with pytest.raises(OptionsError, match="--host-workers must be >= 1, got 0"):
        parse_options(["--model", "m", "--in-endpoint", "ipc://a", "--out-endpoint", "ipc://b", "--block-size", "16", "--host-workers", "0"])
