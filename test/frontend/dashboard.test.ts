// The dashboard against the real server (real CLI, real Python worker on the
// demo model, real HTTP), with an API key set: the page loads without the
// key, its data needs it; in headless Chromium (Debian's chromium, driven by
// puppeteer-core) the page asks for the key, shows live numbers that follow
// the requests sent (exactly: token totals equal the responses' usage), the
// playground streams a reply token by token that equals the non-streamed
// reply, a killed worker shows as restarting and then alive again (a new
// pid), and no console error appears. A
// screenshot is saved (dist/dashboard.png, or BATON_DASHBOARD_SCREENSHOT).
// Without a browser the Chromium part is skipped with one message.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { pathToFileURL } from "node:url";
import { after, before, describe, test } from "node:test";
import puppeteer, { type Browser, type Page } from "puppeteer-core";
import type { DashboardSnapshot } from "../../src/frontend/dashboard/snapshot.js";
import { repoRoot, startServer, type RunningServer } from "../e2e/harness.js";

const KEY = "sk-dashboard-test";
const MODEL = "baton-demo";
const SCREENSHOT = process.env.BATON_DASHBOARD_SCREENSHOT ?? join(repoRoot, "dist", "dashboard.png");

const { findBrowser } = (await import(pathToFileURL(join(repoRoot, "scripts", "find-browser.mjs")).href)) as { findBrowser: () => string | null };
const browserPath = findBrowser();
const NO_BROWSER = browserPath === null
  ? "no Chromium found: install Debian's chromium (npm run setup does when it runs as root with apt-get) or set BATON_CHROMIUM=/path/to/chrome"
  : false;

let server: RunningServer;
let numBlocks = 0;
before(async () => {
  server = await startServer(["--api-key", KEY, "--max-num-seqs", "16"]);
  numBlocks = Number(/(\d+) KV blocks/.exec(server.output())?.[1]);
});
after(async () => {
  await server?.stop();
});

function call(path: string, init: { body?: unknown; auth?: boolean } = {}): Promise<Response> {
  const headers: Record<string, string> = {};
  if (init.auth !== false) headers.authorization = `Bearer ${KEY}`;
  if (init.body !== undefined) headers["content-type"] = "application/json";
  return fetch(`${server.url}${path}`, {
    method: init.body === undefined ? "GET" : "POST",
    headers,
    body: init.body === undefined ? undefined : JSON.stringify(init.body),
  });
}

describe("routes", () => {
  test("the page and its assets load without a key; its data needs the key", async () => {
    for (const path of ["/", "/dashboard"]) {
      const page = await call(path, { auth: false });
      assert.equal(page.status, 200, path);
      assert.match(page.headers.get("content-type") ?? "", /^text\/html/);
      assert.match(page.headers.get("content-security-policy") ?? "", /script-src 'self'/);
      const html = await page.text();
      assert.match(html, /<meta name="baton-api-key" content="required">/);
      assert.match(html, /src="\/dashboard\/dashboard\.js"/);
    }
    const script = await call("/dashboard/dashboard.js", { auth: false });
    assert.equal(script.status, 200);
    assert.match(script.headers.get("content-type") ?? "", /^text\/javascript/);
    assert.match(await script.text(), /\/dashboard\/events/);
    assert.equal((await call("/dashboard/dashboard.css", { auth: false })).status, 200);

    for (const path of ["/dashboard/snapshot", "/dashboard/events"]) {
      const refused = await call(path, { auth: false });
      assert.equal(refused.status, 401, path);
      assert.equal(((await refused.json()) as { error: { code: string } }).error.code, "invalid_api_key");
    }
    const snapshot = (await (await call("/dashboard/snapshot")).json()) as DashboardSnapshot;
    assert.equal(snapshot.model, MODEL);
    assert.equal(snapshot.kvBlocks.total, numBlocks);
    assert.equal(snapshot.worker.alive, true);
    assert.ok(snapshot.worker.pid > 0);
    assert.deepEqual(snapshot.nodes, []);
    assert.deepEqual(
      snapshot.steps.phases.map((p) => p.phase),
      ["schedule", "build", "roundTrip", "process", "workerPrepare", "workerForward", "workerSample"],
    );
  });

  test("/dashboard/events streams snapshots about every 500 ms", async () => {
    const controller = new AbortController();
    const response = await fetch(`${server.url}/dashboard/events`, { headers: { authorization: `Bearer ${KEY}` }, signal: controller.signal });
    assert.equal(response.status, 200);
    assert.match(response.headers.get("content-type") ?? "", /^text\/event-stream/);
    const reader = (response.body as ReadableStream<Uint8Array>).getReader();
    const decoder = new TextDecoder();
    let text = "";
    const started = Date.now();
    while ((text.match(/\n\n/g) ?? []).length < 3) {
      const { value, done } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
    }
    const elapsed = Date.now() - started;
    controller.abort();
    const events = text.split("\n\n").filter((e) => e.startsWith("data: "));
    assert.ok(events.length >= 3, text);
    for (const event of events) assert.equal((JSON.parse(event.slice(6)) as DashboardSnapshot).model, MODEL);
    // The first at once, then one per tick: 3 events take about 1 s.
    assert.ok(elapsed >= 700 && elapsed < 5000, `3 events took ${elapsed} ms`);
  });

  test("the page's script type-checks (strict, DOM types)", () => {
    const tsc = join(repoRoot, "node_modules", "typescript", "bin", "tsc");
    const result = spawnSync(process.execPath, [tsc, "-p", join(repoRoot, "src", "frontend", "dashboard", "tsconfig.json")], { encoding: "utf8" });
    assert.equal(result.status, 0, `${result.stdout}${result.stderr}`);
  });
});

/** The raw number a metric element shows (its data-value). */
async function metric(page: Page, name: string): Promise<number> {
  return Number(await page.evaluate(`document.querySelector('[data-metric="${name}"]')?.dataset.value ?? "NaN"`));
}

async function waitForMetric(page: Page, name: string, condition: string, timeoutMs = 60_000): Promise<void> {
  await page.waitForFunction(`(v => ${condition})(Number(document.querySelector('[data-metric="${name}"]')?.dataset.value))`, {
    timeout: timeoutMs,
    polling: 50,
  });
}

async function text(page: Page, selector: string): Promise<string> {
  return String(await page.evaluate(`document.querySelector(${JSON.stringify(selector)})?.textContent ?? ""`));
}

interface ChatCompletion {
  choices: { message: { content: string } }[];
}
interface Completion {
  usage: { prompt_tokens: number; completion_tokens: number };
}

describe("in headless Chromium", { skip: NO_BROWSER }, () => {
  let browser: Browser;
  let page: Page;
  const consoleErrors: string[] = [];

  before(async () => {
    browser = await puppeteer.launch({
      executablePath: browserPath as string,
      // Root in a container: no user namespaces for Chromium's sandbox.
      args: ["--no-sandbox", "--disable-dev-shm-usage"],
    });
    page = await browser.newPage();
    await page.setViewport({ width: 1280, height: 900 });
    page.on("console", (message) => {
      if (message.type() === "error") consoleErrors.push(message.text());
    });
    page.on("pageerror", (error) => consoleErrors.push(`uncaught: ${error instanceof Error ? error.message : String(error)}`));
    page.on("requestfailed", (request) => consoleErrors.push(`request failed: ${request.url()} ${request.failure()?.errorText ?? ""}`));
  });
  after(async () => {
    await browser?.close();
  });

  test("asks for the key, then shows live data", async () => {
    const response = await page.goto(`${server.url}/`);
    assert.equal(response?.status(), 200);
    await page.waitForSelector("#key-form:not([hidden])");
    assert.equal(await page.evaluate(`document.getElementById("conn").dataset.state`), "key");
    await page.type("#key-input", KEY);
    await page.click("#key-form button[type=submit]");
    await page.waitForFunction(`document.getElementById("conn").dataset.state === "live"`, { timeout: 10_000 });
    await waitForMetric(page, "kv-total", `v === ${numBlocks}`, 10_000);
    const snapshot = (await (await call("/dashboard/snapshot")).json()) as DashboardSnapshot;
    assert.equal(await metric(page, "worker-pid"), snapshot.worker.pid);
    assert.equal(await text(page, '[data-metric="worker-state"]'), "alive");
    assert.equal(await text(page, '[data-metric="model"]'), MODEL);
    assert.equal(await page.evaluate(`document.querySelectorAll("#phases tr").length`), 7);
    assert.equal(await page.evaluate(`document.getElementById("nodes-empty").hidden`), false);
  });

  test("the playground streams a reply, token by token, equal to the non-streamed reply", async () => {
    const prompt = "Tell me about batons.";
    const maxTokens = 40;
    await page.evaluate(`(() => {
      document.getElementById("chat-input").value = ${JSON.stringify(prompt)};
      document.getElementById("chat-max-tokens").value = "${maxTokens}";
      document.getElementById("chat-temperature").value = "0";
      const reply = document.getElementById("chat-reply");
      window.replyStates = [];
      new MutationObserver(() => window.replyStates.push(reply.textContent)).observe(reply, { childList: true, characterData: true, subtree: true });
    })()`);
    await page.click("#chat-send");
    await page.waitForFunction(`document.getElementById("chat-reply").dataset.state !== "streaming"`, { timeout: 60_000 });
    assert.equal(await page.evaluate(`document.getElementById("chat-reply").dataset.state`), "done", await text(page, "#chat-reply"));
    const streamed = await text(page, "#chat-reply");
    const states = (await page.evaluate(`window.replyStates`)) as string[];

    const expected = (await (
      await call("/v1/chat/completions", { body: { model: MODEL, messages: [{ role: "user", content: prompt }], max_tokens: maxTokens, temperature: 0 } })
    ).json()) as ChatCompletion;
    assert.equal(streamed, expected.choices[0]?.message.content);
    // Text appeared piece by piece: many growing prefixes of the final reply.
    const distinct = [...new Set(states.filter((s) => s !== ""))];
    assert.ok(distinct.length >= 5, `only ${distinct.length} intermediate states`);
    for (const state of distinct) assert.ok(streamed.startsWith(state), `${JSON.stringify(state)} is not a prefix of the reply`);
    assert.match(await text(page, "#chat-stats"), /TTFT [\d.,]+ ms · [\d,]+ tokens/);
  });

  test("numbers follow the load: running requests, tokens/s, exact token totals, latencies", async () => {
    await waitForMetric(page, "running", "v === 0");
    // The page shows a snapshot up to a tick old: let it catch up with the server
    // (the playground's requests just ended) before taking the totals to add to.
    const now = ((await (await call("/dashboard/snapshot")).json()) as DashboardSnapshot).totals;
    await waitForMetric(page, "generation-total", `v === ${now.generationTokens}`, 5_000);
    await waitForMetric(page, "prompt-total", `v === ${now.promptTokens}`, 5_000);
    await waitForMetric(page, "finished", `v === ${now.finishedRequests}`, 5_000);
    const before = {
      generation: await metric(page, "generation-total"),
      prompt: await metric(page, "prompt-total"),
      finished: await metric(page, "finished"),
    };
    const n = 4;
    // Long enough (about a second or more on CPU) that the page, which gets one
    // snapshot per 500 ms tick, sees the requests running.
    const maxTokens = 600;
    const requests = Array.from({ length: n }, (_, i) =>
      call("/v1/completions", { body: { model: MODEL, prompt: `load request ${i}: the relay team`, max_tokens: maxTokens, ignore_eos: true } }).then(
        async (response) => {
          assert.equal(response.status, 200);
          return (await response.json()) as Completion;
        },
      ),
    );
    await waitForMetric(page, "running", "v >= 2");
    await waitForMetric(page, "generation-tps", "v > 0");
    await waitForMetric(page, "kv-used", "v > 0");
    await page.waitForFunction(`document.querySelector('[data-phase="roundTrip"] td')?.textContent !== "–"`);
    // The picture for the README: under load, with the playground's reply.
    mkdirSync(dirname(SCREENSHOT), { recursive: true });
    await page.screenshot({ path: SCREENSHOT as `${string}.png`, fullPage: true });
    const png = readFileSync(SCREENSHOT);
    assert.deepEqual([...png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
    assert.ok(png.readUInt32BE(16) >= 1280, "screenshot width");

    const done = await Promise.all(requests);
    const generated = done.reduce((sum, r) => sum + r.usage.completion_tokens, 0);
    const prompted = done.reduce((sum, r) => sum + r.usage.prompt_tokens, 0);
    assert.equal(generated, n * maxTokens);
    await waitForMetric(page, "generation-total", `v === ${before.generation + generated}`, 5_000);
    await waitForMetric(page, "prompt-total", `v === ${before.prompt + prompted}`, 5_000);
    await waitForMetric(page, "finished", `v === ${before.finished + n}`, 5_000);
    await waitForMetric(page, "running", "v === 0", 5_000);
    assert.ok((await metric(page, "ttft-count")) >= n + 2);
    assert.ok((await metric(page, "itl-p50")) > 0);
    assert.ok((await metric(page, "e2e-count")) >= n + 2);
    // The tokens/s figure is a recent rate: back to 0 once idle.
    await waitForMetric(page, "generation-tps", "v === 0", 10_000);
  });

  test("a killed worker shows as restarting, then alive again with a new pid", async () => {
    const pid = await metric(page, "worker-pid");
    // Only our server's own child.
    const ppid = Number(/^PPid:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1]);
    assert.equal(ppid, server.proc.pid);
    process.kill(pid, "SIGKILL");
    await page.waitForFunction(`document.querySelector('[data-metric="worker-state"]').textContent === "restarting"`, { timeout: 30_000 });
    assert.match(await text(page, '[data-metric="worker-exit"]'), /SIGKILL/);
    await page.waitForFunction(`document.querySelector('[data-metric="worker-state"]').textContent === "alive"`, { timeout: 60_000 });
    assert.notEqual(await metric(page, "worker-pid"), pid);
    assert.equal(await metric(page, "worker-restarts"), 1);
  });

  test("no console errors, and the open page does not hold up shutdown", async () => {
    assert.deepEqual(consoleErrors, []);
    const started = Date.now();
    const code = await server.stop();
    assert.equal(code, 0);
    // The server's close waits up to 5 s for open connections; the event streams end at once.
    assert.ok(Date.now() - started < 4_000, `stopping took ${Date.now() - started} ms`);
  });
});
