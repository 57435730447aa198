// Finds a Chromium-family browser for the dashboard's headless test
// (test/frontend/dashboard.test.ts) and for setup, which installs Debian's
// chromium when none is found. BATON_CHROMIUM=/path/to/chrome chooses one.
// Only Node built-ins: setup runs this before node_modules exists.

import { accessSync, constants, statSync } from "node:fs";
import { delimiter, join } from "node:path";

const NAMES = ["chromium", "chromium-browser", "google-chrome-stable", "google-chrome"];

function isExecutable(path) {
  try {
    accessSync(path, constants.X_OK);
    return statSync(path).isFile();
  } catch {
    return false;
  }
}

/** The browser's path, or null when there is none. */
export function findBrowser(env = process.env) {
  if (env.BATON_CHROMIUM) return isExecutable(env.BATON_CHROMIUM) ? env.BATON_CHROMIUM : null;
  for (const dir of (env.PATH ?? "").split(delimiter)) {
    if (dir === "") continue;
    for (const name of NAMES) {
      const path = join(dir, name);
      if (isExecutable(path)) return path;
    }
  }
  return null;
}
