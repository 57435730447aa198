"""Sample messages covering every message and struct type of the schema."""

from __future__ import annotations

import numpy as np

from baton_worker.protocol import (
    AddedRequest,
    Fatal,
    LoraLoad,
    LoraWork,
    Ping,
    Pong,
    Ready,
    SamplingParams,
    Shutdown,
    Step,
    StepResult,
    StepTimings,
)


def i32(*values):
    return np.array(values, dtype=np.int32)


def sample_messages() -> dict[str, object]:
    greedy = SamplingParams(temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, seed=None, logprobs=-1)
    seeded = SamplingParams(
        temperature=0.7,
        top_p=0.9,
        top_k=-1,
        min_p=0.05,
        seed=2**40 + 3,  # beyond 32 bits: travels as float64 by the canonical rule
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        repetition_penalty=1.1,
        min_tokens=4,
        suppress_token_ids=i32(151645, 151643),
        logprobs=5,
    )
    return {
        "step_two_added": Step(
            step_id=7,
            added=[AddedRequest(1, i32(1, 2, 3, 70000), 4, greedy), AddedRequest(2, i32(9), 1, seeded)],
            removed=i32(0, -1),
            req_ids=i32(1, 2),
            num_new_tokens=i32(4, 1),
            num_computed=i32(0, 0),
            new_block_counts=i32(1, 1),
            new_block_ids=i32(12, 3),
            sample=np.array([1, 0], dtype=np.uint8),
        ),
        "step_empty": Step(0, [], i32(), i32(), i32(), i32(), i32(), i32(), np.zeros(0, np.uint8)),
        "step_lora": Step(
            step_id=9,
            added=[AddedRequest(3, i32(5, 6), 2, greedy, lora_id=2)],
            removed=i32(),
            req_ids=i32(3),
            num_new_tokens=i32(2),
            num_computed=i32(0),
            new_block_counts=i32(1),
            new_block_ids=i32(4),
            sample=np.array([1], dtype=np.uint8),
            lora=LoraWork([LoraLoad(2, "sql", "/adapters/sql"), LoraLoad(3, "chat", "/adapters/chat")], i32(1)),
        ),
        "ping": Ping(2**32 - 1),
        "ping_large": Ping(2**53 - 1),
        "shutdown": Shutdown(),
        "ready": Ready(2, 4096, 16, 32768, 151936, "Qwen3ForCausalLM", "bfloat16", "cuda:0", 4242, {"version": 1, "nodes": [{"name": "llm", "engine": "kv_cache", "overlap": True}]}),
        "result": StepResult(
            step_id=7,
            req_ids=i32(1),
            token_ids=i32(42),
            logprobs=np.array([-0.125], np.float32),
            top_counts=i32(2),
            top_ids=i32(42, 7),
            top_logprobs=np.array([-0.125, -2.5], np.float32),
            timings=StepTimings(0.25, 3.0, 1e-3),
        ),
        "result_no_logprobs": StepResult(7, i32(1, 2), i32(5, 6), None, None, None, None, StepTimings(0, 0, 0)),
        "result_lora_failed": StepResult(
            9, i32(), i32(), None, None, None, None, StepTimings(0, 0, 0),
            lora_load_failed=i32(3), lora_load_errors=["adapter chat (/adapters/chat): rank 64 exceeds --max-lora-rank 16"],
        ),
        "pong": Pong(-5),
        "fatal": Fatal("unsupported architecture 'GPT2LMHeadModel' — ünïcode"),
    }
