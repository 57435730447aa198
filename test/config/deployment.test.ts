// Deployment files in M*'s format: what they place where, and the one-line
// refusals for files that name an unknown node, list a rank twice, place a
// node twice for a walk, or leave a node unhosted.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { DeploymentError, parseDeployment, placeGraph, readDeployment, type GraphShape } from "../../src/config/deployment.js";

// The demo text-to-speech model's shape: an LLM partition and a codec partition.
const TTS: GraphShape = {
  nodes: ["llm", "codec"],
  walks: [
    { name: "prefill", nodes: ["llm"] },
    { name: "decode", nodes: ["llm"] },
    { name: "codec_chunk", nodes: ["codec"] },
  ],
};

function place(yaml: string) {
  return placeGraph(parseDeployment(yaml, "d.yaml"), TTS);
}

function refused(yaml: string, line: RegExp) {
  assert.throws(
    () => place(yaml),
    (error: unknown) => error instanceof DeploymentError && line.test(error.message) && !error.message.includes("\n"),
  );
}

describe("deployment files", () => {
  test("M*'s two-worker TTS file: llm on rank 0, codec on rank 1", () => {
    const p = place(`
model: demo-tts
max_seq_len: 2048
max_concurrent_requests: 16
kv_cache:
  max_num_pages: 512
model_kwargs: {voice: alloy}
node_groups:
  - node_names: [llm]
    ranks: [0]
  - node_names: [codec]
    ranks: [1]
`);
    assert.deepEqual(p.ranks, [0, 1]);
    assert.deepEqual(p.instances("llm", "prefill"), [[0]]);
    assert.deepEqual(p.instances("llm", "decode"), [[0]]);
    assert.deepEqual(p.instances("codec", "codec_chunk"), [[1]]);
  });

  test("top-level settings are read", () => {
    const d = parseDeployment("max_seq_len: 1024\nmax_concurrent_requests: 8\nkv_cache: {max_num_pages: 64}\nmodel_kwargs: {a: 1}\nnode_groups: [{node_names: [llm, codec], ranks: [0]}]\n", "d.yaml");
    assert.equal(d.maxSeqLen, 1024);
    assert.equal(d.maxConcurrentRequests, 8);
    assert.equal(d.kvCache.maxNumPages, 64);
    assert.deepEqual(d.modelKwargs, { a: 1 });
  });

  test("no file: every node on rank 0", () => {
    const p = placeGraph(null, TTS);
    assert.deepEqual(p.ranks, [0]);
    assert.deepEqual(p.instances("codec", "codec_chunk"), [[0]]);
  });

  test("graph_walks splits one node over workers by walk (prefill/decode disaggregation)", () => {
    const p = place(`
node_groups:
  - {node_names: [llm], ranks: [0], graph_walks: [prefill]}
  - {node_names: [llm], ranks: [1], graph_walks: [decode]}
  - {node_names: [codec], ranks: [1]}
`);
    assert.deepEqual(p.instances("llm", "prefill"), [[0]]);
    assert.deepEqual(p.instances("llm", "decode"), [[1]]);
  });

  test("several ranks are replicas; tp_size groups them into instances", () => {
    const p = place("node_groups:\n  - {node_names: [llm], ranks: [0, 1, 2, 3], tp_size: 2}\n  - {node_names: [codec], ranks: [4, 5]}\n");
    assert.deepEqual(p.instances("llm", "decode"), [[0, 1], [2, 3]]);
    assert.deepEqual(p.instances("codec", "codec_chunk"), [[4], [5]]);
    assert.deepEqual(p.ranks, [0, 1, 2, 3, 4, 5]);
  });

  test("an unknown node is refused, naming it and the model's nodes", () => {
    refused("node_groups:\n  - {node_names: [llm, vocoder], ranks: [0]}\n", /node_groups\[0\]\.node_names: unknown node "vocoder" \(the model's nodes: llm, codec\)/);
  });

  test("a rank listed twice is refused", () => {
    refused("node_groups:\n  - {node_names: [llm, codec], ranks: [0, 1, 0]}\n", /node_groups\[0\]\.ranks: rank 0 is listed twice/);
  });

  test("a node placed twice for the same walk is refused (M*: the later entry wins silently)", () => {
    refused(
      "node_groups:\n  - {node_names: [llm], ranks: [0]}\n  - {node_names: [codec], ranks: [1]}\n  - {node_names: [llm], ranks: [2], graph_walks: [decode]}\n",
      /node "llm" is placed twice for walk "decode": node_groups\[0\] and node_groups\[2\]/,
    );
  });

  test("a node nobody hosts is refused", () => {
    refused("node_groups:\n  - {node_names: [llm], ranks: [0]}\n", /node "codec" is hosted by no node_group \(it runs in walk "codec_chunk"\)/);
    refused(
      "node_groups:\n  - {node_names: [llm], ranks: [0], graph_walks: [prefill]}\n  - {node_names: [codec], ranks: [0]}\n",
      /node "llm" is hosted by no node_group \(it runs in walk "decode"\)/,
    );
  });

  test("unknown walks, walks without the node, and bad shapes are refused by name", () => {
    refused("node_groups:\n  - {node_names: [llm, codec], ranks: [0], graph_walks: [encode]}\n", /graph_walks: unknown walk "encode"/);
    refused("node_groups:\n  - {node_names: [llm], ranks: [0], graph_walks: [codec_chunk]}\n", /walk "codec_chunk" does not run node "llm"/);
    refused("node_groups:\n  - {node_names: [llm, codec], ranks: [0, 1, 2], tp_size: 2}\n", /3 ranks do not split into instances of tp_size 2/);
    refused("node_groups:\n  - {node_names: [llm, codec], ranks: [-1]}\n", /node_groups\[0\]\.ranks\[0\]/);
    refused("node_groups: []\n", /node_groups/);
    refused("nodes_groups: []\n", /unknown key "nodes_groups"|node_groups: required/);
    refused("node_groups:\n  - {node_names: [llm, codec], ranks: [0], replicas: 2}\n", /node_groups\[0\]: unknown key "replicas"/);
    refused("node_groups: [\n", /not valid YAML/);
  });

  test("readDeployment names a missing file", () => {
    assert.throws(() => readDeployment("/nonexistent/d.yaml"), /cannot read the deployment file \/nonexistent\/d\.yaml: ENOENT/);
  });

  const dirs: string[] = [];
  after(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));
  test("readDeployment reads a file and names it in errors", () => {
    const dir = mkdtempSync(join(tmpdir(), "baton-deploy-"));
    dirs.push(dir);
    const path = join(dir, "tts.yaml");
    writeFileSync(path, "node_groups:\n  - {node_names: [llm, codec], ranks: [0]}\n");
    assert.deepEqual(placeGraph(readDeployment(path), TTS).ranks, [0]);
    writeFileSync(path, "node_groups:\n  - {node_names: [tts], ranks: [0]}\n");
    assert.throws(() => placeGraph(readDeployment(path), TTS), /tts\.yaml: node_groups\[0\]\.node_names: unknown node "tts"/);
  });
});
