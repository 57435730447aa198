// Overload on the real server: with --max-num-seqs 1 --max-num-queued-requests 2,
// requests past the bound get 429 with Retry-After and an OpenAI-style body,
// the admitted ones finish, and a normal request succeeds afterwards. A dead
// worker turns generation requests into 503 with Retry-After.

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { parseMetrics } from "../observability/prom-text.js";
import { readFileSync } from "node:fs";
import { demoModelDir, processesMatching, startServer, type RunningServer } from "./harness.js";

const M = 'model_name="baton-demo"';

let server: RunningServer;
before(async () => {
  server = await startServer(["--max-num-seqs", "1", "--max-num-queued-requests", "2"]);
});
after(async () => {
  await server?.stop();
});

async function scrape(): Promise<Map<string, number>> {
  return parseMetrics(await (await fetch(`${server.url}/metrics`)).text());
}

function post(path: string, body: object): Promise<Response> {
  return fetch(`${server.url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
}

const slow = { model: "baton-demo", prompt: "a slow one", max_tokens: 80, ignore_eos: true };

test("past the queue bound: 429 with Retry-After; the admitted requests finish; then a normal request succeeds", async () => {
  // One request running: wait for its first streamed chunk.
  const running = await post("/v1/completions", { ...slow, stream: true });
  assert.equal(running.status, 200);
  const reader = running.body!.getReader();
  await reader.read();
  const drain = (async () => {
    while (!(await reader.read()).done);
  })();

  // A burst: two fit in the queue, the rest are turned away at once.
  const burst = await Promise.all(
    Array.from({ length: 8 }, (_, i) =>
      i % 2 === 0 ? post("/v1/completions", { ...slow, max_tokens: 10 }) : post("/v1/chat/completions", { model: "baton-demo", messages: [{ role: "user", content: "hi" }], max_tokens: 10, ignore_eos: true, stream: true }),
    ).map(async (pending) => {
      const response = await pending;
      return { status: response.status, retryAfter: response.headers.get("retry-after"), body: await response.text() };
    }),
  );
  const statuses = burst.map((r) => r.status).sort();
  assert.deepEqual(statuses, [200, 200, 429, 429, 429, 429, 429, 429], JSON.stringify(statuses));
  for (const r of burst.filter((r) => r.status === 429)) {
    assert.equal(r.retryAfter, "1");
    const body = JSON.parse(r.body) as { error: Record<string, unknown> };
    assert.deepEqual(Object.keys(body.error).sort(), ["code", "message", "param", "type"]);
    assert.equal(body.error.code, "queue_full");
    assert.match(String(body.error.message), /max-num-queued-requests/);
  }
  await drain;

  const m = await scrape();
  assert.equal(m.get(`baton:requests_rejected_total{${M},reason="queue_full"}`), 6);
  assert.equal(m.get(`vllm:num_requests_running{${M}}`), 0);
  assert.equal(m.get(`vllm:num_requests_waiting{${M}}`), 0);

  const normal = await post("/v1/completions", { model: "baton-demo", prompt: "after the storm", max_tokens: 3 });
  assert.equal(normal.status, 200);
  assert.equal(((await normal.json()) as { usage: { completion_tokens: number } }).usage.completion_tokens, 3);
});

test("a dead worker: generation requests get 503 with Retry-After, the server stays up", async () => {
  // Other suites may run demo workers too: ours is the server's child.
  const parentOf = (pid: number): number => Number(readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]?.split(" ")[1]);
  const workers = processesMatching(demoModelDir).filter((pid) => parentOf(pid) === server.proc.pid);
  assert.equal(workers.length, 1, `one worker (${workers.join(", ")})`);
  process.kill(workers[0] as number, "SIGKILL");
  let health = await fetch(`${server.url}/health`);
  for (let i = 0; i < 100 && health.status === 200; i++) {
    await new Promise((r) => setTimeout(r, 20));
    health = await fetch(`${server.url}/health`);
  }
  assert.equal(health.status, 503);
  for (const [path, body] of [
    ["/v1/completions", { model: "baton-demo", prompt: "x", max_tokens: 2 }],
    ["/v1/chat/completions", { model: "baton-demo", messages: [{ role: "user", content: "x" }], max_tokens: 2, stream: true }],
  ] as const) {
    const response = await post(path, body);
    assert.equal(response.status, 503);
    assert.equal(response.headers.get("retry-after"), "5");
    const error = ((await response.json()) as { error: { type: string; message: string } }).error;
    assert.equal(error.type, "service_unavailable");
    assert.match(error.message, /worker/);
  }
  assert.equal((await fetch(`${server.url}/v1/models`)).status, 200, "non-generation routes still answer");
  const m = await scrape();
  assert.ok((m.get(`baton:requests_rejected_total{${M},reason="unavailable"}`) ?? 0) >= 2);
});
