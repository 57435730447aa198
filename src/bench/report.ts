// What a run prints and saves: vLLM's "Serving Benchmark Result" table and its
// result JSON (same key names, so tools that read vLLM's files read ours).

import { basename } from "node:path";
import { LATENCY_METRICS, type BenchMetrics, type LatencyMetric } from "./metrics.js";
import { median } from "../observability/statistics.js";

export interface RunInfo {
  baseUrl: string;
  endpoint: string;
  model: string;
  tokenizer: string | null;
  datasetName: string;
  numPrompts: number;
  requestRate: number;
  burstiness: number;
  maxConcurrency: number | null;
  temperature: number;
  seed: number;
  randomInputLen: number | null;
  randomOutputLen: number | null;
  /** A name for the server in the file (compare: "baton" / the peer's). */
  label: string | null;
}

const METRIC_TITLES: Record<LatencyMetric, [string, string]> = {
  ttft: ["Time to First Token", "TTFT"],
  tpot: ["Time per Output Token (excl. 1st token)", "TPOT"],
  itl: ["Inter-token Latency", "ITL"],
  e2el: ["End-to-end Latency", "E2EL"],
};

function centered(text: string, fill: string, width = 50): string {
  const pad = Math.max(0, width - text.length);
  const left = Math.floor(pad / 2);
  return fill.repeat(left) + text + fill.repeat(pad - left);
}

function row(label: string, value: number | string, decimals = 2): string {
  const shown = typeof value === "string" ? value : Number.isInteger(value) && decimals === 0 ? String(value) : value.toFixed(decimals);
  return `${label.padEnd(40)} ${shown}`;
}

export function resultTable(info: RunInfo, m: BenchMetrics): string {
  const lines = [centered(" Serving Benchmark Result ", "=")];
  lines.push(row("Successful requests:", m.completed, 0));
  lines.push(row("Failed requests:", m.failed, 0));
  if (info.maxConcurrency !== null) lines.push(row("Maximum request concurrency:", info.maxConcurrency, 0));
  if (Number.isFinite(info.requestRate)) lines.push(row("Request rate configured (RPS):", info.requestRate));
  lines.push(row("Benchmark duration (s):", m.durationS));
  lines.push(row("Total input tokens:", m.totalInputTokens, 0));
  lines.push(row("Total generated tokens:", m.totalOutputTokens, 0));
  lines.push(row("Request throughput (req/s):", m.requestThroughput));
  lines.push(row("Output token throughput (tok/s):", m.outputThroughput));
  lines.push(row("Peak output token throughput (tok/s):", m.maxOutputTokensPerS));
  lines.push(row("Peak concurrent requests:", m.maxConcurrentRequests, 0));
  lines.push(row("Total Token throughput (tok/s):", m.totalTokenThroughput));
  for (const metric of LATENCY_METRICS) {
    const [title, short] = METRIC_TITLES[metric];
    const s = m.latency[metric];
    lines.push(centered(title, "-"));
    lines.push(row(`Mean ${short} (ms):`, s.mean));
    lines.push(row(`Median ${short} (ms):`, s.median));
    for (const [p, v] of Object.entries(s.percentiles)) lines.push(row(`P${p} ${short} (ms):`, v));
  }
  lines.push("=".repeat(50));
  return `${lines.join("\n")}\n`;
}

/** vLLM's date stamp, %Y%m%d-%H%M%S in local time. */
export function dateStamp(now = new Date()): string {
  const two = (n: number): string => String(n).padStart(2, "0");
  return `${now.getFullYear()}${two(now.getMonth() + 1)}${two(now.getDate())}-${two(now.getHours())}${two(now.getMinutes())}${two(now.getSeconds())}`;
}

export function defaultResultFilename(info: RunInfo, date: string): string {
  const rate = Number.isFinite(info.requestRate) ? String(info.requestRate) : "inf";
  const concurrency = info.maxConcurrency === null ? "" : `-concurrency${info.maxConcurrency}`;
  return `baton-${rate}qps${concurrency}-${basename(info.model)}-${date}.json`;
}

export type ResultJson = Record<string, string | number | boolean | null | number[] | number[][] | string[]>;

export function resultJson(info: RunInfo, m: BenchMetrics, date: string): ResultJson {
  const out: ResultJson = {
    date,
    backend: "openai",
    endpoint_type: info.endpoint === "/v1/chat/completions" ? "openai-chat" : "openai",
    base_url: info.baseUrl,
    endpoint: info.endpoint,
    label: info.label,
    model_id: info.model,
    tokenizer_id: info.tokenizer,
    dataset_name: info.datasetName,
    num_prompts: info.numPrompts,
    request_rate: Number.isFinite(info.requestRate) ? info.requestRate : "inf",
    burstiness: info.burstiness,
    max_concurrency: info.maxConcurrency,
    temperature: info.temperature,
    seed: info.seed,
    random_input_len: info.randomInputLen,
    random_output_len: info.randomOutputLen,
    duration: m.durationS,
    completed: m.completed,
    failed: m.failed,
    total_input_tokens: m.totalInputTokens,
    total_output_tokens: m.totalOutputTokens,
    request_throughput: m.requestThroughput,
    request_goodput: null,
    output_throughput: m.outputThroughput,
    total_token_throughput: m.totalTokenThroughput,
    max_output_tokens_per_s: m.maxOutputTokensPerS,
    max_concurrent_requests: m.maxConcurrentRequests,
    input_lens: m.inputLens,
    output_lens: m.outputLens,
    ttfts: m.ttftsS,
    itls: m.itlsS,
    e2els: m.e2elsS,
    generated_texts: m.generatedTexts,
    errors: m.errors,
  };
  for (const metric of LATENCY_METRICS) {
    const s = m.latency[metric];
    out[`mean_${metric}_ms`] = s.mean;
    out[`median_${metric}_ms`] = s.median;
    out[`std_${metric}_ms`] = s.std;
    for (const [p, v] of Object.entries(s.percentiles)) out[`p${p}_${metric}_ms`] = v;
  }
  return out;
}

/**
 * One line of the compare table: a metric of both servers (the median over
 * rounds) and Baton's value over the peer's in each round (NaN where the
 * peer's is 0).
 */
export interface CompareRow {
  temperature: number;
  metric: string;
  baton: number;
  peer: number;
  ratios: number[];
}

export const COMPARE_METRICS: readonly { key: string; label: string }[] = [
  { key: "output_throughput", label: "output tok/s" },
  { key: "median_ttft_ms", label: "TTFT p50 (ms)" },
  { key: "p99_ttft_ms", label: "TTFT p99 (ms)" },
  { key: "median_itl_ms", label: "ITL p50 (ms)" },
  { key: "median_e2el_ms", label: "E2EL p50 (ms)" },
];

/**
 * The compare table. With one round, Baton / peer is the two values' ratio;
 * with more, it is the median of the rounds' ratios, and a last column lists
 * each round's ratio in order.
 */
export function compareTable(peerName: string, rows: readonly CompareRow[]): string {
  const fmt = (v: number): string => (Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(2));
  const times = (v: number): string => (Number.isFinite(v) ? `${v.toFixed(2)}x` : "-");
  const rounds = Math.max(1, ...rows.map((r) => r.ratios.length));
  const head = `| temperature | metric | Baton | ${peerName} | Baton / ${peerName} |`;
  const rule = "| --- | --- | ---: | ---: | ---: |";
  const line = (r: CompareRow): string => {
    const finite = r.ratios.filter(Number.isFinite);
    const ratio = `| ${r.temperature} | ${r.metric} | ${fmt(r.baton)} | ${fmt(r.peer)} | ${finite.length > 0 ? times(median(finite)) : "-"} |`;
    if (rounds === 1) return ratio;
    return `${ratio} ${r.ratios.map(times).join(", ")} |`;
  };
  const lines = rounds === 1 ? [head, rule] : [`${head} per round |`, `${rule} --- |`];
  return `${[...lines, ...rows.map(line)].join("\n")}\n`;
}
