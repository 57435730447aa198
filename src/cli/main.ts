// The `baton` command: dispatches to subcommands and maps failures to exit
// codes (2: usage error, 1: could not start). bin/baton.mjs calls main().

import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { MAIN_HELP, parseServeArgs, SERVE_HELP, UsageError } from "./args.js";

/** The repository root: the nearest ancestor with Baton's package.json (works from src/ and dist/src/). */
function findRepoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const manifest = join(dir, "package.json");
    if (existsSync(manifest) && (JSON.parse(readFileSync(manifest, "utf8")) as { name?: string }).name === "baton") return dir;
    const parent = dirname(dir);
    if (parent === dir) throw new Error("cannot find Baton's package.json");
    dir = parent;
  }
}

function version(root: string): string {
  return (JSON.parse(readFileSync(join(root, "package.json"), "utf8")) as { version: string }).version;
}

function usageError(message: string, helpHint: string): number {
  process.stderr.write(`baton: ${message}\nRun '${helpHint}' for usage.\n`);
  return 2;
}

/** Runs the command line; resolves with the exit code. */
export async function main(argv: readonly string[]): Promise<number> {
  const root = findRepoRoot();
  const [command, ...rest] = argv;
  if (command === undefined) {
    process.stderr.write(MAIN_HELP);
    return 2;
  }
  if (command === "--help" || command === "-h" || command === "help") {
    process.stdout.write(MAIN_HELP);
    return 0;
  }
  if (command === "--version" || command === "-v" || command === "version") {
    process.stdout.write(`baton ${version(root)}\n`);
    return 0;
  }
  if (command === "bench") {
    // Loaded only for bench: it pulls in the server, the engine and the worker supervisor.
    const { parseBenchArgs, runBench, benchHelp } = await import("./bench.js");
    let args;
    try {
      args = parseBenchArgs(rest);
    } catch (error) {
      if (error instanceof UsageError) {
        // One line: load generators are scripted, and their logs are grepped.
        const sub = ["serve", "compare", "overhead", "soak"].includes(rest[0] ?? "") ? `${rest[0]} ` : "";
        process.stderr.write(`baton: ${error.message} (see baton bench ${sub}--help)\n`);
        return 2;
      }
      throw error;
    }
    if (args.help) {
      process.stdout.write(benchHelp(args));
      return 0;
    }
    return runBench(args, root);
  }
  if (command !== "serve") return usageError(`unknown command '${command}'`, "baton --help");

  let parsed;
  try {
    parsed = parseServeArgs(rest);
  } catch (error) {
    if (error instanceof UsageError) return usageError(error.message, "baton serve --help");
    throw error;
  }
  if (parsed.help) {
    process.stdout.write(SERVE_HELP);
    return 0;
  }
  // Loaded only for serve, so --help and --version stay instant (no native addons, no fastify).
  const { serve, ServeError } = await import("./serve.js");
  try {
    return await serve(parsed.options, root);
  } catch (error) {
    if (error instanceof ServeError) {
      process.stderr.write(`baton: ${error.message}\n`);
      return 1;
    }
    throw error;
  }
}
