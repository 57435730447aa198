// Auth, /metrics and structured logs on the real server with the real worker:
// every route but /health needs the API key; /metrics exposes vLLM's names
// with values that follow the requests made; per-request JSON log lines carry
// the request id.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { parseMetrics } from "../observability/prom-text.js";
import { startServer, type RunningServer } from "./harness.js";

const KEY = "sk-test-observability";
const M = 'model_name="baton-demo"';

let server: RunningServer;
before(async () => {
  server = await startServer(["--api-key", KEY, "--max-num-seqs", "8"]);
});
after(async () => {
  await server?.stop();
});

function call(path: string, init: { method?: string; body?: unknown; auth?: string | null } = {}): Promise<Response> {
  const headers: Record<string, string> = {};
  if (init.body !== undefined) headers["content-type"] = "application/json";
  const auth = init.auth === undefined ? `Bearer ${KEY}` : init.auth;
  if (auth !== null) headers.authorization = auth;
  return fetch(`${server.url}${path}`, {
    method: init.method ?? (init.body === undefined ? "GET" : "POST"),
    headers,
    body: init.body === undefined ? undefined : JSON.stringify(init.body),
  });
}

async function scrape(): Promise<Map<string, number>> {
  const response = await call("/metrics");
  assert.equal(response.status, 200);
  assert.match(response.headers.get("content-type") ?? "", /text\/plain/);
  return parseMetrics(await response.text());
}

const completion = { model: "baton-demo", prompt: "Hello there", max_tokens: 5, ignore_eos: true };
const chat = { model: "baton-demo", messages: [{ role: "user", content: "Hi" }], max_tokens: 4, ignore_eos: true };

const ROUTES: { path: string; body?: unknown; ok: number }[] = [
  { path: "/v1/models", ok: 200 },
  { path: "/v1/models/baton-demo", ok: 200 },
  { path: "/v1/completions", body: completion, ok: 200 },
  { path: "/v1/chat/completions", body: chat, ok: 200 },
  { path: "/metrics", ok: 200 },
  { path: "/version", ok: 200 },
  { path: "/tokenize", body: { model: "baton-demo", prompt: "hi" }, ok: 200 },
  { path: "/no/such/route", ok: 404 },
];

describe("auth", () => {
  test("/health needs no key", async () => {
    const response = await call("/health", { auth: null });
    assert.equal(response.status, 200);
  });

  for (const route of ROUTES) {
    test(`${route.body === undefined ? "GET" : "POST"} ${route.path}: missing or wrong key -> 401, right key -> ${route.ok}`, async () => {
      for (const auth of [null, "Bearer wrong-key", `Bearer ${KEY}x`, `Basic ${KEY}`, KEY]) {
        const response = await call(route.path, { body: route.body, auth });
        assert.equal(response.status, 401, `auth ${auth}`);
        assert.equal(response.headers.get("www-authenticate"), "Bearer");
        const body = (await response.json()) as { error: Record<string, unknown> };
        assert.deepEqual(Object.keys(body.error).sort(), ["code", "message", "param", "type"]);
        assert.equal(body.error.type, "invalid_request_error");
        assert.equal(body.error.code, "invalid_api_key");
      }
      const response = await call(route.path, { body: route.body });
      assert.equal(response.status, route.ok);
      await response.arrayBuffer();
    });
  }
});

describe("/metrics", () => {
  test("exposes vLLM's names and Baton's own, with values that follow the requests", async () => {
    const before = await scrape();
    const names = [
      `vllm:num_requests_running{${M}}`,
      `vllm:num_requests_waiting{${M}}`,
      `vllm:kv_cache_usage_perc{${M}}`,
      `vllm:prefix_cache_queries_total{${M}}`,
      `vllm:prefix_cache_hits_total{${M}}`,
      `vllm:time_to_first_token_seconds_count{${M}}`,
      `vllm:inter_token_latency_seconds_count{${M}}`,
      `vllm:e2e_request_latency_seconds_count{${M}}`,
      `vllm:request_queue_time_seconds_count{${M}}`,
      `vllm:request_prefill_time_seconds_count{${M}}`,
      `vllm:request_decode_time_seconds_count{${M}}`,
      `vllm:request_inference_time_seconds_count{${M}}`,
      `vllm:request_prompt_tokens_count{${M}}`,
      `vllm:request_generation_tokens_count{${M}}`,
      `vllm:request_params_max_tokens_count{${M}}`,
      `vllm:prompt_tokens_total{${M}}`,
      `vllm:generation_tokens_total{${M}}`,
      `vllm:num_preemptions_total{${M}}`,
      `vllm:request_success_total{${M},finished_reason="length"}`,
      `vllm:request_success_total{${M},finished_reason="stop"}`,
      `vllm:request_success_total{${M},finished_reason="abort"}`,
      `baton:kv_free_blocks{${M}}`,
      `baton:kv_total_blocks{${M}}`,
      `baton:step_phase_seconds_count{${M},phase="schedule"}`,
      `baton:step_phase_seconds_count{${M},phase="build"}`,
      `baton:step_phase_seconds_count{${M},phase="worker"}`,
      `baton:step_phase_seconds_count{${M},phase="process"}`,
      `baton:requests_rejected_total{${M},reason="unauthorized"}`,
    ];
    for (const name of names) assert.ok(before.has(name), `missing ${name}`);
    assert.ok(before.has(`vllm:time_to_first_token_seconds_bucket{le="+Inf",${M}}`));

    // Three collected, two streamed (one chat), all ending on max_tokens; the same prompt twice for prefix hits.
    const N = 5;
    const prompt = "The same long prompt, repeated so that the prefix cache has whole blocks to hit. ".repeat(3);
    let completionTokens = 0;
    for (let i = 0; i < 3; i++) {
      const response = await call("/v1/completions", { body: { ...completion, prompt, max_tokens: 6 } });
      assert.equal(response.status, 200);
      completionTokens += ((await response.json()) as { usage: { completion_tokens: number } }).usage.completion_tokens;
    }
    for (const [path, body] of [["/v1/completions", completion], ["/v1/chat/completions", chat]] as const) {
      const response = await call(path, { body: { ...body, stream: true, stream_options: { include_usage: true } } });
      const text = await response.text();
      const usage = text
        .split("\n")
        .filter((l) => l.startsWith("data: {"))
        .map((l) => JSON.parse(l.slice(6)) as { usage?: { completion_tokens: number } | null })
        .find((c) => c.usage)?.usage;
      assert.ok(usage, "a usage chunk");
      completionTokens += usage.completion_tokens;
    }

    const now = await scrape();
    const delta = (name: string): number => (now.get(name) ?? NaN) - (before.get(name) ?? NaN);
    assert.equal(delta(`vllm:request_success_total{${M},finished_reason="length"}`), N);
    assert.equal(delta(`vllm:e2e_request_latency_seconds_count{${M}}`), N);
    assert.equal(delta(`vllm:time_to_first_token_seconds_count{${M}}`), N);
    for (const phase of ["queue", "prefill", "decode", "inference"]) assert.equal(delta(`vllm:request_${phase}_time_seconds_count{${M}}`), N, phase);
    // Each request's phases add up: inference = prefill + decode.
    const sum = (phase: string): number => delta(`vllm:request_${phase}_time_seconds_sum{${M}}`);
    assert.ok(Math.abs(sum("inference") - sum("prefill") - sum("decode")) < 1e-6);
    assert.ok(sum("prefill") > 0 && sum("decode") > 0);
    assert.equal(delta(`vllm:request_prompt_tokens_count{${M}}`), N);
    assert.equal(delta(`vllm:request_generation_tokens_sum{${M}}`), completionTokens);
    assert.equal(delta(`vllm:request_params_max_tokens_count{${M}}`), N);
    // Prefix cache counters are in tokens: every prompt token was looked up.
    assert.equal(delta(`vllm:prefix_cache_queries_total{${M}}`), delta(`vllm:request_prompt_tokens_sum{${M}}`));
    assert.equal(delta(`vllm:generation_tokens_total{${M}}`), completionTokens);
    assert.equal(delta(`vllm:inter_token_latency_seconds_count{${M}}`), completionTokens - N);
    assert.ok(delta(`vllm:prompt_tokens_total{${M}}`) > 3 * 16, "prompt tokens counted");
    assert.ok(delta(`vllm:prefix_cache_queries_total{${M}}`) > 0, "prefix cache queried");
    assert.ok(delta(`vllm:prefix_cache_hits_total{${M}}`) >= 16, "the repeated prompt hit the prefix cache");
    assert.ok(delta(`baton:step_phase_seconds_count{${M},phase="worker"}`) >= completionTokens / 2, "steps timed");
    assert.ok((now.get(`vllm:e2e_request_latency_seconds_sum{${M}}`) ?? 0) > (before.get(`vllm:e2e_request_latency_seconds_sum{${M}}`) ?? 0));
    assert.equal(now.get(`vllm:num_requests_running{${M}}`), 0, "nothing running afterwards");
    assert.equal(now.get(`vllm:num_requests_waiting{${M}}`), 0);
    assert.equal(now.get(`baton:kv_free_blocks{${M}}`), now.get(`baton:kv_total_blocks{${M}}`), "every block free (or cached)");
    const usage = now.get(`vllm:kv_cache_usage_perc{${M}}`) ?? NaN;
    assert.ok(usage >= 0 && usage <= 1);
    assert.ok((now.get(`baton:requests_rejected_total{${M},reason="unauthorized"}`) ?? 0) > 0);
  });
});

describe("start-up banner and logs", () => {
  test("the banner says what is served where; request lines are JSON with the request id", async () => {
    const response = await call("/v1/completions", { body: completion });
    const { id } = (await response.json()) as { id: string };
    // The log line is written when the engine finishes, before the response; allow the pipe a moment.
    let lines: Record<string, unknown>[] = [];
    for (let i = 0; i < 50; i++) {
      lines = server
        .output()
        .split("\n")
        .filter((l) => l.startsWith("{"))
        .map((l) => JSON.parse(l) as Record<string, unknown>);
      if (lines.some((l) => l.request_id === id && l.msg === "request finished")) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    const output = server.output();
    assert.match(output, /^Baton serving baton-demo \(.*\) on http:\/\/127\.0\.0\.1:\d+$/m);
    assert.match(output, /metrics: GET \/metrics/);
    assert.match(output, /auth: +on/);
    assert.match(output, /health: +GET \/health/);
    const received = lines.find((l) => l.request_id === id && l.msg === "request received");
    const finished = lines.find((l) => l.request_id === id && l.msg === "request finished");
    assert.ok(received, "a 'request received' line");
    assert.ok(finished, "a 'request finished' line");
    assert.equal(finished.level, "info");
    assert.equal(finished.finish_reason, "length");
    assert.equal(finished.completion_tokens, 5);
    assert.equal(typeof finished.latency_ms, "number");
    assert.equal(typeof finished.ttft_ms, "number");
    assert.equal(typeof finished.prompt_tokens, "number");
    assert.ok(!output.includes(KEY), "the key is never logged");
  });
});
