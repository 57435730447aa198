// A `baton serve` child process for the hand-run benches: started on a free
// port, its URL read from its "on http://..." line, stopped by the bench.
import { spawn } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const repo = join(dirname(fileURLToPath(import.meta.url)), "..");

/** Starts `baton serve ARGS --port 0`; resolves with its URL and a stop() that resolves on its exit. */
export async function startBatonServer(args) {
  const server = spawn(process.execPath, [join(repo, "bin", "baton.mjs"), "serve", ...args, "--port", "0"], { stdio: ["ignore", "pipe", "pipe"] });
  const url = await new Promise((resolve, reject) => {
    let out = "";
    const onData = (chunk) => {
      out += chunk;
      const match = out.match(/on (http:\/\/[\d.]+:\d+)/);
      if (match) resolve(match[1]);
    };
    server.stdout.on("data", onData);
    server.stderr.on("data", onData);
    server.once("exit", (code) => reject(new Error(`server exited ${code}:\n${out}`)));
  });
  // stop() resolves once the server (and so its workers, which it stops first) has exited: a next
  // server on the same GPU must not size its KV cache while this one's memory is still held.
  const exited = new Promise((resolve) => server.once("exit", resolve));
  return { url, stop: () => (server.kill("SIGTERM"), exited) };
}

/**
 * POSTs requests(0..n-1) to /v1/completions, `concurrency` at a time; resolves with the
 * output tokens/s over the whole run and each request's answer.
 */
export async function runCompletions(url, n, concurrency, request) {
  const answers = new Array(n);
  let next = 0;
  let tokens = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < n) {
        const i = next++;
        const r = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(request(i)) });
        const body = await r.json();
        if (r.status !== 200) throw new Error(JSON.stringify(body));
        answers[i] = body;
        tokens += body.usage.completion_tokens;
      }
    }),
  );
  return { rate: tokens / ((performance.now() - t0) / 1000), answers };
}

/**
 * POSTs bodyOf(0..n-1) to /v1/chat/completions, `concurrency` at a time (greedy, ignore_eos added), each
 * answer checked to be maxTokens long; resolves with the requests per second over the whole run.
 */
export async function chatRequestsPerSecond(url, n, concurrency, bodyOf, maxTokens) {
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < n) {
        const i = next++;
        const res = await fetch(`${url}/v1/chat/completions`, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify({ ...bodyOf(i), max_tokens: maxTokens, temperature: 0, ignore_eos: true }),
        });
        const body = await res.json();
        if (res.status !== 200 || body.usage.completion_tokens !== maxTokens) throw new Error(JSON.stringify(body).slice(0, 300));
      }
    }),
  );
  return n / ((performance.now() - t0) / 1000);
}

/** `baton serve MODEL`, one warm-up run at concurrency 4, then run(url, c) for each level: level -> its result. */
export async function servedLevels(model, levels, run) {
  const results = {};
  const server = await startBatonServer([model, "--log-level", "warn"]);
  try {
    await run(server.url, 4);
    for (const c of levels) results[c] = await run(server.url, c);
  } finally {
    await server.stop();
  }
  return results;
}
