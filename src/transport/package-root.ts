// Locates the package root (the directory holding package.json and
// protocol/schema.json) from a module URL, so the same code works when run
// from src/ through a loader or from the compiled dist/src/ tree.

import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

function findRoot(fromUrl: string): string {
  let dir = dirname(fileURLToPath(fromUrl));
  for (;;) {
    if (existsSync(join(dir, "package.json")) && existsSync(join(dir, "protocol", "schema.json"))) return dir;
    const parent = dirname(dir);
    if (parent === dir) throw new Error(`cannot find the Baton package root above ${fileURLToPath(fromUrl)}`);
    dir = parent;
  }
}

/** Absolute path of the repository / package root. */
export const packageRoot: string = findRoot(import.meta.url);
