// --plot-out: one PNG with the run's latency percentiles (bars, log scale) and
// output tokens/s with requests in flight over time (lines). ECharts renders
// an SVG string server-side (no DOM, no browser) and resvg turns it into PNG.
// Both are loaded only when a plot is asked for.

import { writeFileSync } from "node:fs";
import type { EChartsOption } from "echarts";
import { LATENCY_METRICS, type BenchMetrics } from "./metrics.js";

const WIDTH = 1200;
const HEIGHT = 900;
const METRIC_LABELS = { ttft: "TTFT", tpot: "TPOT", itl: "ITL", e2el: "E2EL" } as const;

export class PlotError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "PlotError";
  }
}

function chartOption(title: string, metrics: BenchMetrics): EChartsOption {
  const first = metrics.latency.ttft;
  const stats: { name: string; pick: (m: (typeof metrics.latency)["ttft"]) => number }[] = [
    { name: "mean", pick: (s) => s.mean },
    { name: "median", pick: (s) => s.median },
    ...Object.keys(first.percentiles).map((p) => ({ name: `p${p}`, pick: (s: typeof first) => s.percentiles[p] ?? 0 })),
  ];
  // A log axis cannot show 0 (a metric with no samples): such bars are left out.
  const positive = (v: number): number | null => (v > 0 ? Number(v.toFixed(3)) : null);
  return {
    animation: false,
    backgroundColor: "#ffffff",
    textStyle: { fontFamily: "DejaVu Sans, Arial, sans-serif" },
    title: [
      { text: title, left: "center", top: 8, textStyle: { fontSize: 16 } },
      { text: "Latency (ms, log scale)", left: 60, top: 44, textStyle: { fontSize: 13 } },
      { text: "Output tokens/s (left) and requests in flight (right, dashed) over time", left: 60, top: 474, textStyle: { fontSize: 13 } },
    ],
    legend: [
      { data: stats.map((s) => s.name), top: 68, left: "center" },
      { data: ["output tok/s", "requests in flight"], top: 498, left: "center" },
    ],
    grid: [
      { left: 80, right: 60, top: 104, height: 320 },
      { left: 80, right: 80, top: 540, height: 300 },
    ],
    xAxis: [
      { type: "category", gridIndex: 0, data: LATENCY_METRICS.map((m) => METRIC_LABELS[m]) },
      { type: "value", gridIndex: 1, name: "seconds since the first request", nameLocation: "middle", nameGap: 28, min: 0, max: Number(metrics.durationS.toFixed(2)) },
    ],
    yAxis: [
      { type: "log", gridIndex: 0, logBase: 10 },
      { type: "value", gridIndex: 1, min: 0 },
      { type: "value", gridIndex: 1, min: 0, minInterval: 1, position: "right", splitLine: { show: false } },
    ],
    series: [
      ...stats.map((s) => ({
        name: s.name,
        type: "bar" as const,
        xAxisIndex: 0,
        yAxisIndex: 0,
        label: { show: true, position: "top" as const, fontSize: 9, formatter: (p: { value?: unknown }) => formatMs(Number(p.value)) },
        data: LATENCY_METRICS.map((m) => positive(s.pick(metrics.latency[m]))),
      })),
      {
        name: "output tok/s",
        type: "line",
        color: "#3b6fd6",
        xAxisIndex: 1,
        yAxisIndex: 1,
        showSymbol: false,
        data: metrics.timeline.map((p) => [Number(p.t.toFixed(3)), Math.round(p.outputTokensPerS)]),
      },
      {
        name: "requests in flight",
        type: "line",
        color: "#d64545",
        step: "end",
        xAxisIndex: 1,
        yAxisIndex: 2,
        showSymbol: false,
        lineStyle: { type: "dashed" },
        data: metrics.timeline.map((p) => [Number(p.t.toFixed(3)), p.running]),
      },
    ],
  };
}

function formatMs(value: number): string {
  if (!Number.isFinite(value)) return "";
  return value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : value.toFixed(2);
}

/** Renders the chart to SVG in Node (ECharts server-side rendering). */
async function renderSvg(option: EChartsOption): Promise<string> {
  const echarts = await importOrExplain(() => import("echarts"), "echarts");
  const chart = echarts.init(null, null, { renderer: "svg", ssr: true, width: WIDTH, height: HEIGHT });
  try {
    chart.setOption(option);
    return chart.renderToSVGString();
  } finally {
    chart.dispose();
  }
}

async function svgToPng(svg: string): Promise<Buffer> {
  const { Resvg } = await importOrExplain(() => import("@resvg/resvg-js"), "@resvg/resvg-js");
  const rendered = new Resvg(svg, { background: "#ffffff", font: { loadSystemFonts: true, defaultFontFamily: "DejaVu Sans" } }).render();
  return rendered.asPng();
}

export async function writePlot(path: string, title: string, metrics: BenchMetrics): Promise<void> {
  const png = await svgToPng(await renderSvg(chartOption(title, metrics)));
  try {
    writeFileSync(path, png);
  } catch (error) {
    throw new PlotError(`cannot write ${path}: ${(error as Error).message}`);
  }
}

async function importOrExplain<T>(load: () => Promise<T>, name: string): Promise<T> {
  try {
    return await load();
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ERR_MODULE_NOT_FOUND") throw new PlotError(`--plot-out needs the npm package ${name}: run npm install (or npm run setup)`);
    throw error;
  }
}
