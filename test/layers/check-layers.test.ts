// scripts/check-layers.mjs, which npm test runs first: the real tree passes,
// and a planted back-arrow, a product import of bench, an unknown folder and
// an import cycle (type-only) each fail with their names.

import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";

const repoRoot = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

interface LayerChecker {
  violations(root: string): string[];
}

const checker = (await import(pathToFileURL(join(repoRoot, "scripts", "check-layers.mjs")).href)) as LayerChecker;
const trees: string[] = [];
after(() => {
  for (const dir of trees) rmSync(dir, { recursive: true, force: true });
});

function tree(files: Record<string, string>): string {
  const root = mkdtempSync(join(tmpdir(), "baton-layers-"));
  trees.push(root);
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(dirname(join(root, path)), { recursive: true });
    writeFileSync(join(root, path), text);
  }
  return root;
}

test("the repository's src/ keeps its layers", () => {
  assert.deepEqual(checker.violations(repoRoot), []);
});

test("an import up the layers is named", () => {
  const root = tree({
    "src/engine/core.ts": 'import { route } from "../frontend/routes.js";\nexport const x = route;\n',
    "src/frontend/routes.ts": 'import { x } from "../engine/core.js";\nexport const route = 1;\n',
  });
  const found = checker.violations(root);
  assert.ok(found.some((v) => v.includes("src/engine/core.ts imports src/frontend/routes.ts: engine may not import frontend")), found.join("\n"));
  assert.ok(found.some((v) => v.startsWith("import cycle: src/engine/core.ts -> src/frontend/routes.ts")), found.join("\n"));
});

test("the product may not import bench; a new folder needs a place", () => {
  const root = tree({
    "src/frontend/page.ts": 'import type { Stats } from "../bench/metrics.js";\nexport type S = Stats;\n',
    "src/bench/metrics.ts": "export interface Stats { n: number }\n",
    "src/utils/misc.ts": "export const y = 2;\n",
  });
  const found = checker.violations(root);
  assert.ok(found.some((v) => v.includes("frontend may not import bench")), found.join("\n"));
  assert.ok(found.some((v) => v.includes("src/utils/ has no place in the layers")), found.join("\n"));
});

test("a type-only cycle inside one folder is a cycle", () => {
  const root = tree({
    "src/engine/a.ts": 'import type { B } from "./b.js";\nexport interface A { b: B }\n',
    "src/engine/b.ts": 'import type { A } from "./a.js";\nexport interface B { a: A | null }\n',
  });
  assert.deepEqual(checker.violations(root), ["import cycle: src/engine/a.ts -> src/engine/b.ts"]);
});
