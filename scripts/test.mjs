#!/usr/bin/env node
// Runs every test: the layer check of src/ (scripts/check-layers.mjs), knip's
// check for unused exports, files and dependencies (knip.jsonc), the
// TypeScript suites (node:test, against the compiled dist/test tree) and the
// Python worker's pytest suite, then prints the slowest twenty tests and one
// closing line "N passed, M failed". Exits non-zero if anything failed.
//
//   node scripts/test.mjs [filter...]   only test files whose path contains a filter

import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const filters = process.argv.slice(2);
const python = process.env.BATON_PYTHON ?? join(root, ".venv", "bin", "python");

function listTests(dir) {
  if (!existsSync(dir)) return [];
  const found = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const full = join(dir, entry.name);
    if (entry.isDirectory()) found.push(...listTests(full));
    else if (entry.name.endsWith(".test.js")) found.push(full);
  }
  return found.sort();
}

function selected(path) {
  return filters.length === 0 || filters.some((f) => path.includes(f));
}

function buildTypeScript() {
  rmSync(join(root, "dist", "test"), { recursive: true, force: true });
  const tsc = spawnSync(process.execPath, [join(root, "node_modules", "typescript", "bin", "tsc"), "-p", "tsconfig.json"], {
    cwd: root,
    stdio: "inherit",
  });
  if (tsc.status !== 0) {
    console.error("TypeScript build failed");
    process.exit(1);
  }
}

function runNodeTests() {
  const files = listTests(join(root, "dist", "test")).filter((f) => selected(relative(root, f)));
  if (files.length === 0) return { passed: 0, failed: 0, durations: [] };
  const tap = join(tmpdir(), `baton-node-tests-${process.pid}.tap`);
  const result = spawnSync(
    process.execPath,
    [
      "--test",
      "--test-concurrency=2",
      "--test-reporter=spec",
      "--test-reporter-destination=stdout",
      "--test-reporter=tap",
      `--test-reporter-destination=${tap}`,
      ...files,
    ],
    // Two test files run at once, each with its own workers: one torch thread per worker, or
    // their OpenMP teams (one per core each) oversubscribe the cores and spin against each other.
    { cwd: root, stdio: "inherit", env: { ...process.env, OMP_NUM_THREADS: process.env.OMP_NUM_THREADS ?? "1" } },
  );
  const text = existsSync(tap) ? readFileSync(tap, "utf8") : "";
  rmSync(tap, { force: true });
  const count = (name) => Number(text.match(new RegExp(`^# ${name} (\\d+)$`, "m"))?.[1] ?? 0);
  const passed = count("pass");
  let failed = count("fail") + count("cancelled");
  if (result.status !== 0 && failed === 0) failed = 1;
  return { passed, failed, durations: tapDurations(text) };
}

/** [name, seconds] of every test (not suite) in node's TAP output. */
function tapDurations(text) {
  const lines = text.split("\n");
  const out = [];
  for (let i = 0; i < lines.length; i++) {
    const head = lines[i].match(/^\s*(?:not )?ok \d+ - (.*)$/);
    if (!head) continue;
    let ms = null;
    let suite = false;
    for (let j = i + 1; j < Math.min(i + 8, lines.length) && !/^\s*\.\.\.$/.test(lines[j]); j++) {
      const d = lines[j].match(/duration_ms: ([\d.]+)/);
      if (d) ms = Number(d[1]);
      if (/type: 'suite'/.test(lines[j])) suite = true;
    }
    // A file's own entry (its path) sums its tests: only tests are listed.
    if (ms !== null && !suite && !head[1].endsWith(".test.js")) out.push([head[1], ms / 1000]);
  }
  return out;
}

/** [test id, seconds] from pytest's --durations report (setup, call and teardown summed). */
function pytestDurations(text) {
  const total = new Map();
  for (const m of text.matchAll(/^([\d.]+)s (?:call|setup|teardown)\s+(\S+)$/gm)) {
    total.set(m[2], (total.get(m[2]) ?? 0) + Number(m[1]));
  }
  return [...total];
}

function runPythonTests() {
  const args = ["-m", "pytest", join(root, "python", "tests"), "-q", "-p", "no:cacheprovider", "--durations=40", "--durations-min=1"];
  if (filters.length > 0) {
    if (!filters.some((f) => f.startsWith("python"))) return { passed: 0, failed: 0, durations: [] };
  }
  const result = spawnSync(python, args, {
    cwd: root,
    encoding: "utf8",
    env: { ...process.env, PYTHONPATH: join(root, "python") },
    stdio: ["ignore", "pipe", "inherit"],
  });
  process.stdout.write(result.stdout ?? "");
  const out = result.stdout ?? "";
  const passed = Number(out.match(/(\d+) passed/)?.[1] ?? 0);
  let failed = Number(out.match(/(\d+) failed/)?.[1] ?? 0) + Number(out.match(/(\d+) error/)?.[1] ?? 0);
  if (result.status !== 0 && result.status !== 5 && failed === 0) failed = 1;
  return { passed, failed, durations: pytestDurations(out) };
}

// The layers of src/ first: a back-arrow or an import cycle fails the run at once.
const layers = spawnSync(process.execPath, [join(root, "scripts", "check-layers.mjs")], { cwd: root, stdio: "inherit" });
if (layers.status !== 0) process.exit(1);
// Then knip (knip.jsonc): an unused export, exported type, file or dependency fails it too.
const knip = spawnSync(process.execPath, [join(root, "node_modules", "knip", "bin", "knip.js"), "--no-progress"], { cwd: root, stdio: "inherit" });
if (knip.status !== 0) {
  console.error("knip failed (above): delete what nothing uses; drop the export of what only its own file uses");
  process.exit(1);
}
buildTypeScript();
const started = Date.now();
const node = runNodeTests();
const nodeSeconds = (Date.now() - started) / 1000;
const py = runPythonTests();
const pySeconds = (Date.now() - started) / 1000 - nodeSeconds;
const slowest = [...node.durations, ...py.durations].sort((a, b) => b[1] - a[1]).slice(0, 20);
if (slowest.length > 0) {
  console.log("\nSlowest tests:");
  for (const [name, seconds] of slowest) console.log(`${seconds.toFixed(1).padStart(7)} s  ${name}`);
}
const passed = node.passed + py.passed;
const failed = node.failed + py.failed;
console.log(`\nTypeScript: ${node.passed} passed, ${node.failed} failed (${nodeSeconds.toFixed(0)} s); Python: ${py.passed} passed, ${py.failed} failed (${pySeconds.toFixed(0)} s)`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed > 0 || passed === 0 ? 1 : 0);
