// `baton bench compare`: the same workload against Baton and then a peer
// server, one after the other on the same model directory. Each server is
// started here, measured at every temperature and stopped (its whole process
// group) before the next starts, also when a run fails. Run i at every server
// uses seed + i, so both servers get the same prompts and no run repeats
// another's prompts (a server with a prefix cache gains nothing from order).
//
// With rounds > 1 the servers take turns, in ABBA order (Baton first in the
// 1st, 3rd, ... round, the peer first in the others), so a machine that drifts slower or
// faster during the run weighs on both alike. Each round's ratio compares two
// measurements minutes apart at most; the table gives the median over rounds
// and every round's ratio.

import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { resolvePythonEnv } from "../worker/python-env.js";
import { median } from "../observability/statistics.js";
import { COMPARE_METRICS, compareTable, resultJson, resultTable, dateStamp, type CompareRow, type ResultJson } from "./report.js";
import { BenchError, runServeBench, type ServeBenchOptions } from "./serve-bench.js";
import { freePort, ServerProcess, ServerStartError, type ServerSpec } from "./server-process.js";

export interface PeerSpec {
  name: string;
  /** Shell command line with {model}, {port}, {host} and {python} placeholders. */
  command: string;
  /** The model name requests carry; {model} placeholders allowed. */
  model: string;
  /** Extra environment for the peer. */
  env: Record<string, string>;
  /** Python packages it needs (a requirements file installed on demand), or null. */
  requirements: { file: string; probe: string } | null;
}

/** `--peer transformers`: transformers' own server with continuous batching, on the CPU in float32. */
export function transformersPeer(repoRoot: string): PeerSpec {
  return {
    name: "transformers",
    command:
      "{python} -m transformers.cli.transformers serve {model} --device cpu --dtype float32 " +
      "--continuous-batching --no-cb-use-cuda-graph --host {host} --port {port} --log-level warning",
    // transformers serve pins the preloaded model: requests must name it exactly as on its command line.
    model: "{model}",
    env: { HF_HUB_OFFLINE: "1", TRANSFORMERS_OFFLINE: "1", TOKENIZERS_PARALLELISM: "false" },
    requirements: {
      file: join(repoRoot, "python", "requirements-bench.txt"),
      probe: "import fastapi, uvicorn, openai, pydantic, starlette, accelerate, requests",
    },
  };
}

export interface CompareOptions {
  modelDir: string;
  /** `baton serve` flags (besides the model and --port). */
  batonArgs: string[];
  peer: PeerSpec;
  temperatures: number[];
  /** The workload; baseUrl, model, tokenizer, temperature, seed and label are set per run. */
  workload: ServeBenchOptions;
  startTimeoutMs: number;
  repoRoot: string;
  /** Turns each server takes (ABBA order); 1: Baton, then the peer. */
  rounds: number;
}

interface CompareRun {
  server: string;
  round: number;
  temperature: number;
  result: ResultJson;
}

export interface CompareResult {
  runs: CompareRun[];
  rows: CompareRow[];
  table: string;
}

const HOST = "127.0.0.1";

function fill(template: string, values: Record<string, string>): string {
  return template.replace(/\{(\w+)\}/g, (whole, key: string) => values[key] ?? whole);
}

/** Single-quotes a value for /bin/sh. */
function shellQuote(value: string): string {
  return /^[\w@%+=:,./-]+$/.test(value) ? value : `'${value.replaceAll("'", "'\\''")}'`;
}

/** Installs the peer's Python requirements into the worker's interpreter when its probe import fails. */
function ensurePeerRequirements(peer: PeerSpec, python: string, log: (line: string) => void): void {
  if (peer.requirements === null) return;
  const probe = spawnSync(python, ["-c", peer.requirements.probe], { encoding: "utf8" });
  if (probe.status === 0) return;
  log(`${peer.name} serve needs more Python packages; installing into ${python}: pip install -r ${peer.requirements.file}`);
  const install = spawnSync(python, ["-m", "pip", "install", "-r", peer.requirements.file], { stdio: ["ignore", "inherit", "inherit"] });
  if (install.status !== 0) throw new BenchError(`pip install -r ${peer.requirements.file} failed (exit ${install.status}); install it by hand or pass --peer-command`);
}

export async function runCompare(options: CompareOptions, log: (line: string) => void): Promise<CompareResult> {
  const modelDir = resolve(options.modelDir);
  if (!existsSync(join(modelDir, "config.json"))) throw new BenchError(`${modelDir} is not a model directory (no config.json)`);
  let python: string;
  try {
    python = resolvePythonEnv().python;
  } catch (error) {
    throw new BenchError((error as Error).message);
  }
  ensurePeerRequirements(options.peer, python, log);
  const cli = join(options.repoRoot, "bin", "baton.mjs");
  const servers: { name: string; spec: (port: number) => ServerSpec; model: string | null }[] = [
    {
      name: "baton",
      model: null,
      spec: (port) => ({
        name: "baton",
        command: [process.execPath, cli, "serve", modelDir, "--host", HOST, "--port", String(port), ...options.batonArgs],
        env: process.env,
        cwd: options.repoRoot,
        baseUrl: new URL(`http://${HOST}:${port}/`),
        startTimeoutMs: options.startTimeoutMs,
      }),
    },
    {
      name: options.peer.name,
      model: fill(options.peer.model, { model: modelDir }),
      spec: (port) => ({
        name: options.peer.name,
        command: fill(options.peer.command, { model: shellQuote(modelDir), port: String(port), host: HOST, python: shellQuote(python) }),
        env: { ...process.env, ...options.peer.env },
        cwd: options.repoRoot,
        baseUrl: new URL(`http://${HOST}:${port}/`),
        startTimeoutMs: options.startTimeoutMs,
      }),
    },
  ];
  const runs: CompareRun[] = [];
  const date = dateStamp();
  const temperatures = options.temperatures;
  for (let round = 0; round < options.rounds; round++) {
    const order = round % 2 === 0 ? servers : [...servers].reverse();
    for (const server of order) {
      const port = await freePort(HOST);
      const spec = server.spec(port);
      const turn = options.rounds > 1 ? ` (round ${round + 1} of ${options.rounds})` : "";
      log(`starting ${server.name}${turn}: ${typeof spec.command === "string" ? spec.command : spec.command.join(" ")}`);
      let process_: ServerProcess;
      try {
        process_ = await ServerProcess.start(spec);
      } catch (error) {
        if (error instanceof ServerStartError) throw new BenchError(error.message);
        throw error;
      }
      try {
        for (const [i, temperature] of temperatures.entries()) {
          log(`${server.name}${turn}: temperature ${temperature}, ${options.workload.numPrompts} requests`);
          const run = await runServeBench(
            {
              ...options.workload,
              baseUrl: spec.baseUrl,
              model: server.model,
              tokenizer: modelDir,
              temperature,
              // The same prompts for both servers within a round, new ones in each round.
              seed: options.workload.seed + round * temperatures.length + i,
              label: server.name,
            },
            log,
          );
          process.stderr.write(`${server.name}${turn}, temperature ${temperature}:\n${resultTable(run.info, run.metrics)}`);
          runs.push({ server: server.name, round, temperature, result: resultJson(run.info, run.metrics, date) });
        }
      } finally {
        log(`stopping ${server.name}`);
        await process_.stop();
      }
    }
  }
  const rows: CompareRow[] = [];
  for (const temperature of temperatures) {
    const pairs: { baton: ResultJson; peer: ResultJson }[] = [];
    for (let round = 0; round < options.rounds; round++) {
      const at = (name: string): ResultJson | undefined => runs.find((r) => r.server === name && r.round === round && r.temperature === temperature)?.result;
      const baton = at("baton");
      const peer = at(options.peer.name);
      if (!baton || !peer) continue;
      if (baton.total_output_tokens !== peer.total_output_tokens) {
        log(`round ${round + 1}, temperature ${temperature}: Baton generated ${String(baton.total_output_tokens)} tokens, ${options.peer.name} ${String(peer.total_output_tokens)}: the workloads differ`);
      }
      pairs.push({ baton, peer });
    }
    if (pairs.length === 0) continue;
    for (const { key, label } of COMPARE_METRICS) {
      const value = (r: ResultJson): number => Number(r[key]);
      rows.push({
        temperature,
        metric: label,
        baton: median(pairs.map((p) => value(p.baton))),
        peer: median(pairs.map((p) => value(p.peer))),
        ratios: pairs.map((p) => (value(p.peer) === 0 ? Number.NaN : value(p.baton) / value(p.peer))),
      });
    }
  }
  return { runs, rows, table: compareTable(options.peer.name, rows) };
}
