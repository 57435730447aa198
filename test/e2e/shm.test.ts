// Tensors between real workers through real shared memory (nodes placed on
// several workers): a two-node graph (python/baton_worker/models/tensor_relay)
// whose node a turns the prompt into a float tensor and node b turns it into
// client bytes, served colocated and split over two workers both ways round.
// The bytes are the same under every placement; after many requests, aborted
// ones included, nothing is held and no arena block leaked (a small arena would
// refuse later requests); a worker's segment goes with the worker, killed or not.

import assert from "node:assert/strict";
import { existsSync, mkdirSync, readdirSync, writeFileSync } from "node:fs";
import { request as httpRequest } from "node:http";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { processesMatching, removeDir, startServer, tempDir, type RunningServer } from "./harness.js";

const work = tempDir("shm");
const modelDir = join(work, "relay");
after(() => removeDir(work));

const skip = !existsSync("/dev/shm") && "no /dev/shm on this host";

/** Prompts of many lengths (h is 32 bytes per prompt byte), the empty one included. */
const PROMPTS = ["", "a", "Hello there, how are you today?", "x".repeat(300), "Ünïcødé bytes ✓", "0123456789".repeat(17)];

interface Generated {
  status: number;
  audio: string[];
  error: string | null;
}

async function generate(server: RunningServer, text: string, modelKwargs: Record<string, unknown> = {}): Promise<Generated> {
  const form = new FormData();
  form.set("text", text);
  form.set("output_modalities", "audio");
  form.set("streaming", "false");
  form.set("model_kwargs", JSON.stringify(modelKwargs));
  const res = await fetch(`${server.url}/generate`, { method: "POST", body: form });
  const body = (await res.json()) as { outputs?: { audio?: { data: string }[] }; error?: { message: string } };
  return { status: res.status, audio: (body.outputs?.audio ?? []).map((a) => a.data), error: body.error?.message ?? null };
}

/** A streaming request whose client hangs up after `afterMs` (0: as soon as it is sent). */
function abandoned(server: RunningServer, text: string, afterMs: number): Promise<void> {
  const boundary = "----baton-shm";
  const fields = { text, output_modalities: "audio", streaming: "true" };
  const body = Object.entries(fields).map(([k, v]) => `--${boundary}\r\ncontent-disposition: form-data; name="${k}"\r\n\r\n${v}\r\n`).join("") + `--${boundary}--\r\n`;
  return new Promise((resolve) => {
    const req = httpRequest(`${server.url}/generate`, { method: "POST", headers: { "content-type": `multipart/form-data; boundary=${boundary}` } });
    req.on("error", () => resolve());
    req.on("close", () => resolve());
    req.end(body, () => setTimeout(() => req.destroy(), afterMs));
  });
}

async function metric(server: RunningServer, name: string): Promise<number> {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(name));
  assert.ok(line !== undefined, `metric ${name} missing`);
  return Number(line.split(" ").at(-1));
}

async function eventually(what: string, check: () => Promise<boolean> | boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function segmentsOf(pids: readonly number[]): string[] {
  return readdirSync("/dev/shm").filter((n) => pids.some((p) => n.startsWith(`baton-${p}-`)));
}

function workerPids(): number[] {
  return processesMatching(`--model ${modelDir} `);
}

function deployment(name: string, a: number, b: number): string {
  const file = join(work, `${name}.yaml`);
  writeFileSync(file, `node_groups:\n  - node_names: [a]\n    ranks: [${a}]\n  - node_names: [b]\n    ranks: [${b}]\n`);
  return file;
}

describe("tensors between workers through shared memory", { skip }, () => {
  let expected: string[][] = [];

  before(async () => {
    // The model needs only its config: node weights are fixed by width and seed.
    mkdirSync(modelDir, { recursive: true });
    writeFileSync(join(modelDir, "config.json"), JSON.stringify({ architectures: ["BatonTensorRelay"], width: 8, seed: 3 }));
    const server = await startServer([modelDir]);
    try {
      const results = await Promise.all(PROMPTS.map((p) => generate(server, p)));
      for (const r of results) assert.equal(r.status, 200, r.error ?? "");
      expected = results.map((r) => r.audio);
      assert.ok(expected[3]![0]!.length > 1000, "the long prompt gives samples");
      assert.deepEqual(segmentsOf(workerPids()), [], "one worker publishes nothing");
    } finally {
      await server.stop();
    }
  });

  for (const [name, a, b] of [
    ["a on rank 0, b on rank 1", 0, 1],
    ["a on rank 1, b on rank 0 (the prompt value crosses too)", 1, 0],
  ] as const) {
    test(`${name}: the colocated bytes, nothing held or leaked after requests and aborts`, async () => {
      // 64 KiB per worker: a leaked block per request would exhaust it within the requests below.
      const server = await startServer([modelDir, "--deployment", deployment(`split-${a}${b}`, a, b), "--shm-bytes", "65536"]);
      try {
        const pids = workerPids();
        assert.equal(pids.length, 2);
        assert.equal(segmentsOf(pids).length, 2, "each worker maps its arena");

        for (let round = 0; round < 4; round++) {
          const results = await Promise.all(PROMPTS.map((p) => generate(server, p)));
          assert.deepEqual(
            results.map((r) => r.audio),
            expected,
            `round ${round}: ${results.map((r) => r.error).join("; ")}`,
          );
        }
        // Clients that hang up at random moments, mixed with a failure after the tensor crossed.
        const cuts: Promise<unknown>[] = [];
        for (let i = 0; i < 60; i++) cuts.push(abandoned(server, PROMPTS[i % PROMPTS.length]!, (i * 7) % 5));
        cuts.push(generate(server, "fails in b", { fail_in_b: true }).then((r) => assert.match(r.error ?? `status ${r.status}`, /asked to fail in b/)));
        await Promise.all(cuts);
        await eventually("no tensor held", async () => (await metric(server, "baton:graph_tensors_held")) === 0);
        for (let round = 0; round < 4; round++) {
          assert.deepEqual((await Promise.all(PROMPTS.map((p) => generate(server, p)))).map((r) => r.audio), expected);
        }
        // The gauge is the engine thread's latest snapshot: it reaches 0 once the last ending is posted.
        await eventually("no tensor held after the last round", async () => (await metric(server, "baton:graph_tensors_held")) === 0);

        // A worker killed outright cannot unlink its arena: its supervisor does.
        const victim = pids.find((p) => segmentsOf([p]).length > 0)!;
        process.kill(victim, "SIGKILL");
        await eventually("the killed worker's segment removed", () => segmentsOf([victim]).length === 0);
      } finally {
        const pids = workerPids();
        await server.stop();
        await eventually("no segment left", () => segmentsOf(pids).length === 0);
      }
    });
  }
});
