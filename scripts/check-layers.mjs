#!/usr/bin/env node
// The control plane's layers, checked: which folder of src/ may import which,
// and no import cycle between modules (type-only imports count: they are
// dependencies of the design even where the compiled code drops them).
//
// Top down (a folder imports only folders below it, and the leaves):
//   cli                      the command
//   bench                    a client of the server (nothing in the product imports it)
//   frontend                 HTTP: OpenAI routes, SSE, the dashboard
//   engine-host              where engine cores run (thread, replicas), observability, router
//   conductor, kv-connector  clients of engine cores: graphs of models, disaggregated prefill
//   engine                   engine core: scheduler, KV blocks, step masks, recovery
//   structured               the grammar engine (its thread and client)
//   worker                   the model worker: its process, the step client, supervision
//   transport                wire codec and sockets
//   leaves: graph (compiled graphs), config (model directories, deployments),
//           text, tool-parsers, reasoning
//
//   node scripts/check-layers.mjs [--root DIR]   exits 1 naming every violation

import { existsSync, readFileSync, readdirSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const BELOW_ENGINE = ["structured", "worker", "transport", "text"];
export const MAY_IMPORT = {
  cli: "*",
  bench: "*",
  frontend: ["engine-host", "observability", "router", "conductor", "engine", ...BELOW_ENGINE, "config", "graph", "tool-parsers", "reasoning"],
  "engine-host": ["observability", "router", "conductor", "kv-connector", "engine", ...BELOW_ENGINE, "config", "graph"],
  observability: ["engine", ...BELOW_ENGINE],
  router: [],
  conductor: ["kv-connector", "engine", ...BELOW_ENGINE, "graph"],
  "kv-connector": ["engine", ...BELOW_ENGINE],
  engine: BELOW_ENGINE,
  structured: ["transport", "text"],
  worker: ["transport"],
  transport: [],
  graph: ["transport"],
  config: ["transport"],
  text: [],
  "tool-parsers": ["text"],
  reasoning: ["text"],
};
const NOT_IMPORTED = new Set(["cli", "bench"]); // by anything but themselves (and cli, which may import bench)

const IMPORT = /(?:^|\n)\s*(?:import|export)\s[^;]*?from\s*["'](\.[^"']+)["']|import\(\s*["'](\.[^"']+)["']\s*\)|(?:^|\n)\s*import\s*["'](\.[^"']+)["']/g;

function tsFiles(dir) {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return tsFiles(path);
    return path.endsWith(".ts") ? [path] : [];
  });
}

/** module -> the modules it imports, paths relative to root. */
export function importGraph(root) {
  const graph = new Map();
  for (const file of tsFiles(join(root, "src"))) {
    const text = readFileSync(file, "utf8").replace(/\/\*[\s\S]*?\*\/|\/\/[^\n]*/g, "");
    const deps = [];
    for (const m of text.matchAll(IMPORT)) {
      let target = resolve(dirname(file), m[1] ?? m[2] ?? m[3]).replace(/\.js$/, ".ts");
      if (!existsSync(target) && existsSync(join(target, "index.ts"))) target = join(target, "index.ts");
      if (existsSync(target)) deps.push(relative(root, target));
    }
    graph.set(relative(root, file), deps);
  }
  return graph;
}

const folderOf = (path) => path.split("/")[1];

/** Strongly connected components of more than one module (Tarjan). */
function cycles(graph) {
  let next = 0;
  const index = new Map();
  const low = new Map();
  const stack = [];
  const onStack = new Set();
  const found = [];
  const visit = (v) => {
    index.set(v, next);
    low.set(v, next);
    next++;
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v), low.get(w)));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v), index.get(w)));
    }
    if (low.get(v) === index.get(v)) {
      const component = [];
      let w;
      do {
        w = stack.pop();
        onStack.delete(w);
        component.push(w);
      } while (w !== v);
      if (component.length > 1) found.push(component.sort());
    }
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return found;
}

/** Every violation, one line each. */
export function violations(root) {
  const graph = importGraph(root);
  const out = [];
  for (const [file, deps] of graph) {
    const from = folderOf(file);
    const allowed = MAY_IMPORT[from];
    if (allowed === undefined) {
      out.push(`${file}: src/${from}/ has no place in the layers (scripts/check-layers.mjs MAY_IMPORT)`);
      continue;
    }
    for (const dep of deps) {
      const to = folderOf(dep);
      if (to === from) continue;
      const ok = (allowed === "*" || allowed.includes(to)) && !(NOT_IMPORTED.has(to) && from !== "cli");
      if (!ok) out.push(`${file} imports ${dep}: ${from} may not import ${to}`);
    }
  }
  for (const component of cycles(graph)) out.push(`import cycle: ${component.join(" -> ")}`);
  return out;
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const at = process.argv.indexOf("--root");
  const root = at > 0 ? resolve(process.argv[at + 1]) : dirname(dirname(fileURLToPath(import.meta.url)));
  const found = violations(root);
  for (const line of found) console.error(line);
  if (found.length > 0) {
    console.error(`check-layers: ${found.length} violation(s)`);
    process.exit(1);
  }
  console.log("check-layers: src/ keeps its layers, no import cycles");
}
