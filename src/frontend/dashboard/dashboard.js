// @ts-check
// The dashboard page's script (plain JS, served as is; no build step).
//
// Data: GET /dashboard/events, a text/event-stream of DashboardSnapshot JSON
// (src/frontend/dashboard/snapshot.ts has the shape), read with fetch() and a
// stream reader rather than EventSource: EventSource cannot send an
// Authorization header, and putting the key in the URL would leave it in
// server logs and browser history. When the server has an API key (the page's
// <meta name="baton-api-key"> says so) the page asks for it, keeps it in this
// tab's sessionStorage only, and sends it as "Authorization: Bearer <key>"
// with every data and playground request.
//
// Playground: a streamed POST /v1/chat/completions whose SSE body is read
// with the same parser, appending each delta as it arrives.

const KEY_STORAGE = "baton.apiKey";
const HISTORY_POINTS = 120; // 60 s of snapshots at 500 ms
const RETRY_MS = 1000;

const keyRequired = document.querySelector('meta[name="baton-api-key"]')?.getAttribute("content") === "required";

/** @param {string} id */
function byId(id) {
  const el = document.getElementById(id);
  if (el === null) throw new Error(`the page has no #${id}`);
  return el;
}

// ------------------------------------------------------------------ API key

function storedKey() {
  return sessionStorage.getItem(KEY_STORAGE);
}

/** @returns {Record<string, string>} */
function authHeaders() {
  const key = storedKey();
  return key === null ? {} : { authorization: `Bearer ${key}` };
}

const keyForm = /** @type {HTMLFormElement} */ (byId("key-form"));
const keyInput = /** @type {HTMLInputElement} */ (byId("key-input"));
const forgetKey = /** @type {HTMLButtonElement} */ (byId("forget-key"));

/** @param {string} [error] */
function askForKey(error) {
  sessionStorage.removeItem(KEY_STORAGE);
  forgetKey.hidden = true;
  keyForm.hidden = false;
  byId("key-error").textContent = error ?? "";
  setConnection("key", "API key needed");
  keyInput.focus();
}

keyForm.addEventListener("submit", (event) => {
  event.preventDefault();
  const key = keyInput.value.trim();
  if (key === "") return;
  sessionStorage.setItem(KEY_STORAGE, key);
  keyInput.value = "";
  keyForm.hidden = true;
  forgetKey.hidden = false;
  void connect();
});

forgetKey.addEventListener("click", () => {
  stream?.abort();
  askForKey();
});

// ------------------------------------------------------------- SSE reading

/**
 * Calls onData with the data of each event of a text/event-stream body, in
 * order, until the body ends. An exception from onData ends the reading.
 * @param {Response} response
 * @param {(data: string) => void} onData
 */
async function readEvents(response, onData) {
  if (response.body === null) throw new Error("the response has no body");
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n?/g, "\n");
      for (let end = buffer.indexOf("\n\n"); end >= 0; end = buffer.indexOf("\n\n")) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block
          .split("\n")
          .filter((line) => line.startsWith("data:"))
          .map((line) => line.slice(line.startsWith("data: ") ? 6 : 5))
          .join("\n");
        if (data !== "") onData(data);
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

// --------------------------------------------------------------- formatting

const integer = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });

/** @param {number} n */
function int(n) {
  return integer.format(n);
}

/** @param {number} ms */
function millis(ms) {
  if (ms < 1) return ms.toFixed(3);
  if (ms < 10) return ms.toFixed(2);
  if (ms < 100) return ms.toFixed(1);
  return int(ms);
}

/** @param {number | null} ratio */
function percent(ratio) {
  return ratio === null ? "–" : `${(ratio * 100).toFixed(1)}%`;
}

/** @param {number} s */
function duration(s) {
  if (s < 60) return `${Math.floor(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${Math.floor(s % 60)}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

// ---------------------------------------------------------------- rendering

/** @type {Map<string, HTMLElement[]>} */
const metricElements = new Map();
for (const el of document.querySelectorAll("[data-metric]")) {
  if (!(el instanceof HTMLElement)) continue;
  const name = el.dataset.metric ?? "";
  metricElements.set(name, [...(metricElements.get(name) ?? []), el]);
}

/**
 * Shows `text` in every element of the metric; `value` (the raw number) goes
 * to data-value, for scripts and tests.
 * @param {string} name
 * @param {string} text
 * @param {number | string | null} [value]
 */
function show(name, text, value) {
  for (const el of metricElements.get(name) ?? []) {
    if (el.textContent !== text) el.textContent = text;
    if (value !== undefined && value !== null) el.dataset.value = String(value);
  }
}

/**
 * @param {"live" | "connecting" | "down" | "key"} state
 * @param {string} [text]
 */
function setConnection(state, text) {
  const el = byId("conn");
  el.dataset.state = state;
  el.textContent = text ?? state;
}

/** @typedef {{count: number, p50: number, p90: number, p99: number}} Latency */
/** @typedef {{phase: string, meanMs: number, p50Ms: number, p99Ms: number}} Phase */
/**
 * @typedef {object} Snapshot
 * @property {number} timeMs
 * @property {string} model
 * @property {number} uptimeS
 * @property {{running: number, waiting: number}} requests
 * @property {{used: number, cached: number, free: number, total: number, usage: number}} kvBlocks
 * @property {{hitRate: number | null, lifetimeHitRate: number | null, queriedTokens: number, hitTokens: number}} prefixCache
 * @property {{promptTokensPerS: number, generationTokensPerS: number, requestsPerS: number, stepsPerS: number}} throughput
 * @property {{promptTokens: number, generationTokens: number, finishedRequests: number, steps: number, preemptions: number}} totals
 * @property {{windowS: number, ttftMs: Latency | null, itlMs: Latency | null, e2eMs: Latency | null}} latency
 * @property {{count: number, meanRows: number, meanTokens: number, phases: Phase[]}} steps
 * @property {{pid: number, alive: boolean, state: string, exit: string | null, restarts: number}} worker
 * @property {{node: string, queueDepth: number, stepSeconds: number}[]} nodes
 */

/** @type {Snapshot | null} */
let latest = null;
/** @type {{gen: number, running: number}[]} */
const timeline = [];

/** Display order and labels; the worker's own phases sit inside the round trip. */
const PHASE_LABELS = /** @type {const} */ ([
  ["schedule", "schedule", false],
  ["build", "build", false],
  ["roundTrip", "worker round trip", false],
  ["workerPrepare", "prepare", true],
  ["workerForward", "forward", true],
  ["workerSample", "sample", true],
  ["process", "process", false],
]);

/** @param {Snapshot} s */
function render(s) {
  latest = s;
  show("model", s.model);
  show("uptime", duration(s.uptimeS), s.uptimeS);
  show("running", int(s.requests.running), s.requests.running);
  show("waiting", int(s.requests.waiting), s.requests.waiting);
  show("finished", int(s.totals.finishedRequests), s.totals.finishedRequests);
  show("preemptions", int(s.totals.preemptions), s.totals.preemptions);

  show("kv-used", int(s.kvBlocks.used), s.kvBlocks.used);
  show("kv-total", int(s.kvBlocks.total), s.kvBlocks.total);
  show("kv-cached", int(s.kvBlocks.cached), s.kvBlocks.cached);
  show("kv-usage", percent(s.kvBlocks.usage), s.kvBlocks.usage);
  byId("kv-bar").style.width = `${(s.kvBlocks.usage * 100).toFixed(1)}%`;

  show("prefix-hit-rate", percent(s.prefixCache.hitRate), s.prefixCache.hitRate);
  show("prefix-lifetime", percent(s.prefixCache.lifetimeHitRate), s.prefixCache.lifetimeHitRate);
  show("prefix-hit-tokens", int(s.prefixCache.hitTokens), s.prefixCache.hitTokens);
  show("prefix-query-tokens", int(s.prefixCache.queriedTokens), s.prefixCache.queriedTokens);

  show("generation-tps", int(s.throughput.generationTokensPerS), s.throughput.generationTokensPerS);
  show("prompt-tps", int(s.throughput.promptTokensPerS), s.throughput.promptTokensPerS);
  show("generation-total", int(s.totals.generationTokens), s.totals.generationTokens);
  show("prompt-total", int(s.totals.promptTokens), s.totals.promptTokens);
  show("steps-per-s", int(s.throughput.stepsPerS), s.throughput.stepsPerS);

  for (const [key, name] of /** @type {const} */ ([["ttftMs", "ttft"], ["itlMs", "itl"], ["e2eMs", "e2e"]])) {
    const l = s.latency[key];
    show(`${name}-p50`, l === null ? "–" : millis(l.p50), l?.p50 ?? "");
    show(`${name}-p90`, l === null ? "–" : millis(l.p90), l?.p90 ?? "");
    show(`${name}-p99`, l === null ? "–" : millis(l.p99), l?.p99 ?? "");
    show(`${name}-count`, l === null ? "0" : int(l.count), l?.count ?? 0);
  }

  show("step-count", int(s.steps.count), s.steps.count);
  show("step-rows", s.steps.meanRows.toFixed(1), s.steps.meanRows);
  show("step-tokens", s.steps.meanTokens.toFixed(1), s.steps.meanTokens);
  renderPhases(s.steps.phases);

  show("worker-state", s.worker.state, s.worker.state);
  show("worker-restarts", int(s.worker.restarts), s.worker.restarts);
  show("worker-pid", String(s.worker.pid), s.worker.pid);
  show("worker-exit", s.worker.exit ?? "");
  renderNodes(s.nodes);

  timeline.push({ gen: s.throughput.generationTokensPerS, running: s.requests.running });
  if (timeline.length > HISTORY_POINTS) timeline.shift();
  drawSparkline();
}

/** @param {Phase[]} phases */
function renderPhases(phases) {
  const byName = new Map(phases.map((p) => [p.phase, p]));
  const widest = Math.max(1e-9, ...phases.map((p) => p.meanMs));
  const body = byId("phases");
  if (body.children.length !== PHASE_LABELS.length) {
    body.replaceChildren(
      ...PHASE_LABELS.map(([phase, label, inner]) => {
        const row = document.createElement("tr");
        row.dataset.phase = phase;
        const name = document.createElement("th");
        name.textContent = inner ? `└ ${label}` : label;
        if (inner) name.className = "muted";
        const bar = document.createElement("div");
        bar.className = "pbar";
        const barCell = document.createElement("td");
        barCell.append(bar);
        row.append(name, document.createElement("td"), document.createElement("td"), document.createElement("td"), barCell);
        return row;
      }),
    );
  }
  for (const row of body.children) {
    if (!(row instanceof HTMLElement)) continue;
    const p = byName.get(row.dataset.phase ?? "");
    const cells = row.children;
    const values = p === undefined ? ["–", "–", "–"] : [millis(p.meanMs), millis(p.p50Ms), millis(p.p99Ms)];
    for (let i = 0; i < 3; i++) {
      const cell = cells[i + 1];
      if (cell !== undefined && cell.textContent !== values[i]) cell.textContent = values[i] ?? "";
    }
    const bar = cells[4]?.firstElementChild;
    if (bar instanceof HTMLElement) bar.style.width = `${(((p?.meanMs ?? 0) / widest) * 100).toFixed(1)}%`;
  }
}

/** @param {Snapshot["nodes"]} nodes */
function renderNodes(nodes) {
  byId("nodes-empty").hidden = nodes.length > 0;
  byId("nodes").replaceChildren(
    ...nodes.map((n) => {
      const row = document.createElement("tr");
      row.dataset.node = n.node;
      for (const text of [n.node, int(n.queueDepth), millis(n.stepSeconds * 1000)]) {
        const cell = document.createElement(row.children.length === 0 ? "th" : "td");
        cell.textContent = text;
        row.append(cell);
      }
      return row;
    }),
  );
}

function drawSparkline() {
  const canvas = /** @type {HTMLCanvasElement} */ (byId("spark"));
  const scale = window.devicePixelRatio || 1;
  const width = canvas.clientWidth;
  const height = canvas.clientHeight;
  if (canvas.width !== Math.round(width * scale)) canvas.width = Math.round(width * scale);
  if (canvas.height !== Math.round(height * scale)) canvas.height = Math.round(height * scale);
  const ctx = canvas.getContext("2d");
  if (ctx === null) return;
  ctx.setTransform(scale, 0, 0, scale, 0, 0);
  ctx.clearRect(0, 0, width, height);
  const top = 16;
  const plot = height - top - 2;
  const step = width / (HISTORY_POINTS - 1);
  const x0 = width - (timeline.length - 1) * step;
  /**
   * @param {(h: {gen: number, running: number}) => number} pick
   * @param {string} color
   * @param {boolean} fill
   */
  const line = (pick, color, fill) => {
    const max = Math.max(1, ...timeline.map(pick));
    ctx.beginPath();
    timeline.forEach((h, i) => {
      const x = x0 + i * step;
      const y = top + plot - (pick(h) / max) * plot;
      if (i === 0) ctx.moveTo(x, y);
      else ctx.lineTo(x, y);
    });
    ctx.strokeStyle = color;
    ctx.lineWidth = 1.5;
    ctx.stroke();
    if (fill && timeline.length > 1) {
      ctx.lineTo(x0 + (timeline.length - 1) * step, top + plot);
      ctx.lineTo(x0, top + plot);
      ctx.closePath();
      ctx.fillStyle = "rgba(92, 200, 255, 0.12)";
      ctx.fill();
    }
    return max;
  };
  const maxGen = line((h) => h.gen, "#5cc8ff", true);
  const maxRunning = line((h) => h.running, "#f5b84c", false);
  ctx.font = "11px system-ui, sans-serif";
  ctx.fillStyle = "#8a94a3";
  ctx.fillText(`max ${int(maxGen)} tok/s · ${int(maxRunning)} running`, 4, 11);
}

// --------------------------------------------------------------- the stream

/** @type {AbortController | null} */
let stream = null;

async function connect() {
  stream?.abort();
  if (keyRequired && storedKey() === null) {
    askForKey();
    return;
  }
  forgetKey.hidden = storedKey() === null;
  const controller = new AbortController();
  stream = controller;
  setConnection("connecting", "connecting");
  try {
    const response = await fetch("/dashboard/events", { headers: authHeaders(), signal: controller.signal, cache: "no-store" });
    if (response.status === 401) {
      askForKey("The server refused that key.");
      return;
    }
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    setConnection("live", "live");
    await readEvents(response, (data) => render(/** @type {Snapshot} */ (JSON.parse(data))));
  } catch {
    // Network errors and a stream the server ended: reconnect below.
  }
  if (controller.signal.aborted) return;
  setConnection("down", "disconnected, retrying");
  setTimeout(() => {
    if (stream === controller) void connect();
  }, RETRY_MS);
}

// --------------------------------------------------------------- playground

const chatForm = /** @type {HTMLFormElement} */ (byId("chat-form"));
const chatInput = /** @type {HTMLTextAreaElement} */ (byId("chat-input"));
const chatReply = byId("chat-reply");
const chatSend = /** @type {HTMLButtonElement} */ (byId("chat-send"));
const chatStop = /** @type {HTMLButtonElement} */ (byId("chat-stop"));
const chatStats = byId("chat-stats");
/** @type {AbortController | null} */
let chat = null;

/** The served model's name: from the latest snapshot, else /v1/models. */
async function modelName() {
  if (latest !== null) return latest.model;
  const response = await fetch("/v1/models", { headers: authHeaders() });
  if (!response.ok) throw new Error(`GET /v1/models: HTTP ${response.status}`);
  const models = /** @type {{data: {id: string}[]}} */ (await response.json());
  const first = models.data[0];
  if (first === undefined) throw new Error("the server lists no model");
  return first.id;
}

/** @param {string} id */
function numberInput(id) {
  return Number(/** @type {HTMLInputElement} */ (byId(id)).value);
}

chatForm.addEventListener("submit", (event) => {
  event.preventDefault();
  void sendChat();
});
chatStop.addEventListener("click", () => chat?.abort());

async function sendChat() {
  if (keyRequired && storedKey() === null) {
    askForKey();
    return;
  }
  const controller = new AbortController();
  chat = controller;
  chatSend.disabled = true;
  chatStop.disabled = false;
  chatReply.textContent = "";
  chatReply.dataset.state = "streaming";
  chatStats.textContent = "";
  const started = performance.now();
  let firstMs = 0;
  let chunks = 0;
  let completionTokens = 0;
  try {
    const body = {
      model: await modelName(),
      messages: [{ role: "user", content: chatInput.value }],
      max_tokens: numberInput("chat-max-tokens"),
      temperature: numberInput("chat-temperature"),
      stream: true,
      stream_options: { include_usage: true },
    };
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", ...authHeaders() },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (response.status === 401) {
      askForKey("The server refused that key.");
      throw new Error("unauthorized");
    }
    if (!response.ok) {
      const error = /** @type {{error?: {message?: string}} | null} */ (await response.json().catch(() => null));
      throw new Error(error?.error?.message ?? `HTTP ${response.status}`);
    }
    await readEvents(response, (data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message ?? "the stream failed");
      const text = chunk.choices?.[0]?.delta?.content;
      if (typeof text === "string" && text !== "") {
        if (firstMs === 0) firstMs = performance.now();
        chunks++;
        chatReply.append(text);
      }
      if (chunk.usage) completionTokens = chunk.usage.completion_tokens;
      const tokens = completionTokens || chunks;
      const seconds = (performance.now() - started) / 1000;
      chatStats.textContent = `TTFT ${firstMs === 0 ? "–" : millis(firstMs - started)} ms · ${int(tokens)} tokens · ${(tokens / seconds).toFixed(1)} tok/s`;
    });
    chatReply.dataset.state = "done";
  } catch (error) {
    if (controller.signal.aborted) {
      chatReply.dataset.state = "stopped";
    } else {
      chatReply.dataset.state = "error";
      chatReply.append(`${chatReply.textContent === "" ? "" : "\n"}error: ${error instanceof Error ? error.message : String(error)}`);
    }
  } finally {
    chatSend.disabled = false;
    chatStop.disabled = true;
    if (chat === controller) chat = null;
  }
}

void connect();
