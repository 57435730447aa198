"""Tensors between two graph workers through shared memory, at the GraphStepRunner level.

Two runners over the same two-node model (`double`: x -> h, `tail`: h -> client
bytes), rank 0 and rank 1, each with its own arena in /dev/shm: what the
producer publishes the consumer copies out, and the bytes equal those of one
worker running both nodes; releasing the handle frees the block; a tensor that
does not fit fails that request only and leaves nothing behind."""

from __future__ import annotations

import pytest
import torch

from baton_worker.graph.node_runner import NodeRunner
from baton_worker.graph.worker_runner import GraphStepRunner
from baton_worker.runtime.options import OptionsError, parse_options
from baton_worker.protocol import NamedValues, NodePass, PassBatch, PromptRequest
from baton_worker.transfer.shm import SHM_DIR, ShmArena
from test_graph_worker import Toy, graph_step, pcm_of, run


@pytest.fixture
def workers():
    made: list[GraphStepRunner] = []

    def make(rank: int, nodes: list[str], arena_bytes: int | None = 1 << 16) -> GraphStepRunner:
        arena = ShmArena(arena_bytes, tag=f"test-rank{rank}-{len(made)}") if arena_bytes else None
        runner = GraphStepRunner(NodeRunner(Toy(), "cpu", nodes), rank=rank, arena=arena)
        made.append(runner)
        return runner

    yield make
    for runner in made:
        runner.close()
    assert not [r.arena.name for r in made if r.arena and (SHM_DIR / r.arena.name).exists()]


def x_pass(pass_id: int, request_id: int, value) -> NodePass:
    return NodePass(pass_id, request_id, [NamedValues("x", [value])])


def h_pass(pass_id: int, request_id: int, value) -> NodePass:
    return NodePass(pass_id, request_id, [NamedValues("h", [value])])


def colocated_bytes(xs: list[list[float]]) -> list[bytes]:
    one = GraphStepRunner(NodeRunner(Toy(), "cpu"), rank=0)
    prompts = [PromptRequest(i, "go", ["audio"], ["audio"], {"x": x}) for i, x in enumerate(xs)]
    values = [p.values[0].values[0] for p in run(one, graph_step(prompts=prompts)).prompt_results]
    doubled = run(one, graph_step(batches=[PassBatch(1, "double", "main", [x_pass(i, i, v) for i, v in enumerate(values)])]))
    hs = [r.outputs[0].values[0] for r in doubled.pass_results]
    tails = run(one, graph_step(batches=[PassBatch(2, "tail", "main", [h_pass(i, i, h) for i, h in enumerate(hs)])]))
    return [pcm_of(r) for r in tails.pass_results]


def test_an_output_published_on_rank_0_is_consumed_on_rank_1_with_the_same_bytes(workers):
    xs = [[1.0, 2.5, 3.0], [0.25] * 100]
    producer = workers(0, ["double"])
    consumer = workers(1, ["tail"], arena_bytes=None)
    prompts = [PromptRequest(i, "go", ["audio"], ["audio"], {"x": x}) for i, x in enumerate(xs)]
    values = [p.values[0].values[0] for p in run(producer, graph_step(prompts=prompts)).prompt_results]
    assert all(v.segment == "" for v in values)  # consumed where it was made: not published

    batch = PassBatch(1, "double", "main", [x_pass(i, i, v) for i, v in enumerate(values)], publish=["h"])
    doubled = run(producer, graph_step(batches=[batch]))
    run(producer, graph_step(releases=[v.handle for v in values]))
    hs = [r.outputs[0].values[0] for r in doubled.pass_results]
    assert [(h.worker, h.segment, h.nbytes) for h in hs] == [(0, producer.arena.name, 12), (0, producer.arena.name, 400)]
    assert producer.arena.live_blocks == 2 and len(producer.nodes.store) == 2

    tails = run(consumer, graph_step(batches=[PassBatch(2, "tail", "main", [h_pass(i, i, h) for i, h in enumerate(hs)])]))
    assert [r.error for r in tails.pass_results] == [None, None]
    assert [pcm_of(r) for r in tails.pass_results] == colocated_bytes(xs)
    assert len(consumer.nodes.store) == 0  # copied out for the pass, nothing kept

    # The consumer answered; the control plane releases the handles, the producer frees the blocks.
    run(producer, graph_step(releases=[h.handle for h in hs]))
    assert producer.arena.live_blocks == 0 and len(producer.nodes.store) == 0


def test_a_prompt_value_published_for_another_rank(workers):
    producer = workers(0, [])
    consumer = workers(1, ["double"], arena_bytes=None)
    prompt = PromptRequest(0, "go", ["audio"], ["audio"], {"x": [1.5, 2.0]}, publish=["x", "ids"])
    (result,) = run(producer, graph_step(prompts=[prompt])).prompt_results
    x, ids = (nv.values[0] for nv in result.values)
    assert x.segment == producer.arena.name and ids.form == "tokens" and ids.segment == ""  # token ids travel inline
    (doubled,) = run(consumer, graph_step(batches=[PassBatch(1, "double", "main", [x_pass(1, 0, x)])])).pass_results
    assert doubled.error is None
    h = doubled.outputs[0].values[0]
    assert torch.equal(consumer.nodes.store.get(h.handle), torch.tensor([3.0, 4.0]))
    run(producer, graph_step(releases=[x.handle]))
    assert producer.arena.live_blocks == 0


def test_a_tensor_that_does_not_fit_fails_its_request_only(workers):
    producer = workers(0, ["double"], arena_bytes=256)
    prompts = [PromptRequest(i, "go", ["audio"], ["audio"], {"x": x}) for i, x in enumerate([[1.0] * 4, [1.0] * 1000])]
    values = [p.values[0].values[0] for p in run(producer, graph_step(prompts=prompts)).prompt_results]
    batch = PassBatch(1, "double", "main", [x_pass(i, i, v) for i, v in enumerate(values)], publish=["h"])
    small, big = run(producer, graph_step(batches=[batch])).pass_results
    run(producer, graph_step(releases=[v.handle for v in values]))
    assert small.error is None and small.outputs[0].values[0].segment == producer.arena.name
    assert big.error.startswith("node 'double': outputs: shared-memory arena") and "no room for 4000 bytes" in big.error
    assert big.outputs == [] and len(producer.nodes.store) == 1 and producer.arena.live_blocks == 1

    # A prompt value that does not fit refuses the request, and stores nothing.
    big_prompt = PromptRequest(2, "go", ["audio"], ["audio"], {"x": [1.0] * 1000}, publish=["x"])
    (refused,) = run(producer, graph_step(prompts=[big_prompt])).prompt_results
    assert refused.error.startswith("process_prompt: shared-memory arena") and refused.values == []
    assert len(producer.nodes.store) == 1


def test_a_worker_without_an_arena_refuses_to_publish_and_a_vanished_segment_fails_the_pass(workers):
    producer = workers(0, [], arena_bytes=None)
    prompt = PromptRequest(0, "go", ["audio"], ["audio"], {"x": [1.0]}, publish=["x"])
    (refused,) = run(producer, graph_step(prompts=[prompt])).prompt_results
    assert refused.error == "process_prompt: worker 0 has no shared-memory arena (--shm-bytes) to publish 'x'"
    assert len(producer.nodes.store) == 0

    other = workers(2, [])
    (ok,) = run(other, graph_step(prompts=[PromptRequest(1, "go", ["audio"], ["audio"], {"x": [1.0]}, publish=["x"])])).prompt_results
    x = ok.values[0].values[0]
    other.arena.close()  # its worker exited
    consumer = workers(1, ["double"], arena_bytes=None)
    (failed,) = run(consumer, graph_step(batches=[PassBatch(1, "double", "main", [x_pass(1, 1, x)])])).pass_results
    assert failed.error == f"node 'double': inputs: input 'x' from worker 2: shared-memory segment {x.segment} is gone (its worker exited)"


def test_the_worker_flag_sizes_the_arena():
    base = ["--model", "m", "--in-endpoint", "a", "--out-endpoint", "b", "--block-size", "16"]
    assert parse_options(base).shm_bytes == 0
    assert parse_options([*base, "--shm-bytes", "4096"]).shm_bytes == 4096
    with pytest.raises(OptionsError, match="--shm-bytes must be >= 0"):
        parse_options([*base, "--shm-bytes", "-1"])
