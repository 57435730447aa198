// `baton bench compare` through the real CLI: Baton on the demo model against
// a peer that is a second Baton (--peer-command), both started and stopped by
// the command. With --rounds the servers take turns in ABBA order, each round
// gives both the same prompts and new ones, and the table lists every round's
// ratio. No timing assertions (shared, noisy machines).

import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { after, test } from "node:test";
import { demoModelDir, processesMatching, removeDir, repoRoot, runCliAsync, tempDir } from "../e2e/harness.js";

const skip = !existsSync(join(demoModelDir, "tokenizer.json")) && "no demo model (npm run setup)";

function bench(args: string[], timeoutMs?: number): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return runCliAsync(["bench", ...args], timeoutMs);
}

interface Run {
  server: string;
  round: number;
  temperature: number;
  result: Record<string, unknown>;
}

const dir = skip ? "" : tempDir("bench-compare");
// Marks both servers' command lines, to prove that none is left running.
const MARKER = `compare-test-${process.pid}`;

after(() => {
  if (dir !== "") removeDir(dir);
});

test("bench compare --rounds 2: ABBA turns, the same prompts for both servers in a round, each round's ratio", { skip, timeout: 300_000 }, async () => {
  const peerModel = `${MARKER}-peer`;
  const peerCommand = `${process.execPath} ${join(repoRoot, "bin", "baton.mjs")} serve {model} --host {host} --port {port} --served-model-name ${peerModel} --log-level warn`;
  const prompts = 6;
  const run = await bench(
    [
      "compare", demoModelDir,
      "--peer-command", peerCommand, "--peer-name", "other", "--peer-model", peerModel,
      `--serve-args=--served-model-name ${MARKER}-baton --log-level warn`,
      "--rounds", "2", "--temperatures", "0,1",
      "--num-prompts", String(prompts), "--max-concurrency", "3", "--random-input-len", "16", "--random-output-len", "6", "--seed", "40",
      "--save-result", "--result-dir", dir, "--result-filename", "compare.json",
    ],
    280_000,
  );
  assert.equal(run.code, 0, `exit ${run.code}\n${run.stderr.slice(-3000)}`);

  // Turns: Baton, other (round 1), then other, Baton (round 2).
  const starts = [...run.stderr.matchAll(/bench: starting (\S+) \(round (\d) of 2\)/g)].map((m) => `${m[1]}@${m[2]}`);
  assert.deepEqual(starts, ["baton@1", "other@1", "other@2", "baton@2"]);

  const saved = JSON.parse(readFileSync(join(dir, "compare.json"), "utf8")) as { runs: Run[]; table: string };
  assert.equal(saved.runs.length, 8);
  const at = (server: string, round: number, temperature: number): Record<string, unknown> => {
    const found = saved.runs.find((r) => r.server === server && r.round === round && r.temperature === temperature);
    assert.ok(found, `${server}, round ${round}, temperature ${temperature}`);
    return found.result;
  };
  const seeds = new Set<unknown>();
  for (const round of [0, 1]) {
    for (const temperature of [0, 1]) {
      const baton = at("baton", round, temperature);
      const other = at("other", round, temperature);
      // One seed per (round, temperature), shared by both servers: the same prompts.
      assert.equal(baton.seed, other.seed);
      assert.deepEqual(baton.input_lens, other.input_lens);
      seeds.add(baton.seed);
      for (const r of [baton, other]) {
        assert.equal(r.completed, prompts);
        assert.equal(r.total_output_tokens, prompts * 6);
      }
    }
  }
  assert.equal(seeds.size, 4, "every round and temperature has prompts of its own");

  // The table: medians, the median ratio, and each round's ratio, per temperature and metric.
  assert.equal(run.stdout, saved.table);
  const lines = run.stdout.trim().split("\n");
  assert.match(lines[0] as string, /\| temperature \| metric \| Baton \| other \| Baton \/ other \| per round \|/);
  const rows = lines.slice(2);
  assert.equal(rows.length, 2 * 5);
  const throughput = rows.find((l) => l.startsWith("| 1 | output tok/s |"));
  assert.ok(throughput, run.stdout);
  const cells = throughput.split("|").map((c) => c.trim());
  const perRound = (cells[6] as string).split(", ").map((c) => Number(c.replace(/x$/, "")));
  assert.equal(perRound.length, 2);
  const ratioOf = (round: number): number => Number(at("baton", round, 1).output_throughput) / Number(at("other", round, 1).output_throughput);
  perRound.forEach((ratio, round) => assert.ok(Math.abs(ratio - ratioOf(round)) < 0.006, `round ${round + 1}: ${ratio} vs ${ratioOf(round)}`));
  const median = Number((cells[5] as string).replace(/x$/, ""));
  assert.ok(Math.abs(median - (ratioOf(0) + ratioOf(1)) / 2) < 0.006, `median ${median}`);

  assert.deepEqual(processesMatching(MARKER), [], "both servers are stopped");
});

test("bench compare refuses --rounds 0, naming the flag", { skip, timeout: 30_000 }, async () => {
  const run = await bench(["compare", demoModelDir, "--peer", "transformers", "--rounds", "0"], 25_000);
  assert.notEqual(run.code, 0);
  assert.match(run.stderr, /invalid value '0' for --rounds: expected an integer >= 1/);
});
