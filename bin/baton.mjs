#!/usr/bin/env node
// The `baton` command. The implementation is compiled TypeScript under dist/;
// this file only finds it and says what to do when the build is missing.

import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const entry = join(root, "dist", "src", "cli", "main.js");

if (!existsSync(entry)) {
  process.stderr.write(`baton: the build is missing (${entry}); run npm run setup\n`);
  process.exit(1);
}

const { main } = await import(pathToFileURL(entry).href);
let code;
try {
  code = await main(process.argv.slice(2));
} catch (error) {
  process.stderr.write(`baton: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  code = 1;
}
// Exit explicitly: closed sockets and timers of a stopped server must not keep the process alive.
process.exit(code);
