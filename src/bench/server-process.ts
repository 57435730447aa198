// Servers that `baton bench compare` starts and stops: each runs in its own
// process group (a shell command's children included), counts as ready when
// GET /health (or /v1/models) answers 200, and is stopped with SIGTERM to the
// whole group, then SIGKILL after a grace period; a group still alive when this
// process exits is killed on the way out.

import { spawn, type ChildProcess } from "node:child_process";
import { createServer } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";

export class ServerStartError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ServerStartError";
  }
}

/** Process groups still running, killed if this process exits first. */
const liveGroups = new Set<number>();
let exitHookInstalled = false;

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.on("exit", () => {
    for (const pgid of liveGroups) killGroup(pgid, "SIGKILL");
  });
  // Ctrl-C: the exit hook above runs only if we exit, so turn the signal into an exit.
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    process.once(signal, () => process.exit(130));
  }
}

function killGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // Already gone.
  }
}

export async function freePort(host = "127.0.0.1"): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, host, () => {
      const address = server.address();
      const port = typeof address === "object" && address !== null ? address.port : 0;
      server.close(() => resolve(port));
    });
  });
}

export interface ServerSpec {
  /** Shown in messages ("baton", "transformers"). */
  name: string;
  /** argv (no shell) or one shell command line (run with /bin/sh -c). */
  command: readonly string[] | string;
  env: NodeJS.ProcessEnv;
  cwd: string;
  baseUrl: URL;
  startTimeoutMs: number;
}

const OUTPUT_KEPT = 16_000;

export class ServerProcess {
  private output = "";
  private readonly exited: Promise<number | null>;
  private stopping: Promise<void> | null = null;

  private constructor(
    readonly spec: ServerSpec,
    private readonly child: ChildProcess,
  ) {
    const keep = (chunk: Buffer): void => {
      this.output = (this.output + chunk.toString()).slice(-OUTPUT_KEPT);
    };
    child.stdout?.on("data", keep);
    child.stderr?.on("data", keep);
    this.exited = new Promise((resolve) => child.once("exit", (code) => resolve(code)));
    void this.exited.then(() => liveGroups.delete(child.pid as number));
  }

  /** Starts the server and waits until it answers; stops it again if it does not. */
  static async start(spec: ServerSpec): Promise<ServerProcess> {
    installExitHook();
    const [file, args] = typeof spec.command === "string" ? ["/bin/sh", ["-c", spec.command]] : [spec.command[0] as string, spec.command.slice(1)];
    const child = spawn(file, args, { cwd: spec.cwd, env: spec.env, stdio: ["ignore", "pipe", "pipe"], detached: true });
    const spawned = await new Promise<Error | null>((resolve) => {
      child.once("spawn", () => resolve(null));
      child.once("error", (error) => resolve(error));
    });
    if (spawned !== null) throw new ServerStartError(`${spec.name}: cannot start ${file}: ${spawned.message}`);
    liveGroups.add(child.pid as number);
    const server = new ServerProcess(spec, child);
    try {
      await server.waitReady();
    } catch (error) {
      await server.stop();
      throw error;
    }
    return server;
  }

  get pid(): number {
    return this.child.pid as number;
  }

  /** The exit code once it has exited (null: still running, or killed by a signal). */
  get exitCode(): number | null {
    return this.child.exitCode;
  }

  /** The last lines the server printed. */
  outputTail(lines = 20): string {
    return this.output.trimEnd().split("\n").slice(-lines).join("\n");
  }

  private async waitReady(): Promise<void> {
    const deadline = Date.now() + this.spec.startTimeoutMs;
    let exitCode: number | null | undefined;
    void this.exited.then((code) => (exitCode = code));
    while (Date.now() < deadline) {
      if (exitCode !== undefined) {
        throw new ServerStartError(`${this.spec.name} exited with code ${exitCode} before it was ready; its last output:\n${this.outputTail()}`);
      }
      for (const path of ["health", "v1/models"]) {
        if (await answers(new URL(path, this.spec.baseUrl))) return;
      }
      await sleep(250);
    }
    throw new ServerStartError(`${this.spec.name} was not ready after ${Math.round(this.spec.startTimeoutMs / 1000)} s; its last output:\n${this.outputTail()}`);
  }

  /** SIGTERM to the process group, SIGKILL after graceMs; resolves once the group leader has exited. */
  stop(graceMs = 15_000): Promise<void> {
    this.stopping ??= (async () => {
      const pgid = this.child.pid as number;
      if (this.child.exitCode === null && this.child.signalCode === null) {
        killGroup(pgid, "SIGTERM");
        const timer = setTimeout(() => killGroup(pgid, "SIGKILL"), graceMs);
        await this.exited;
        clearTimeout(timer);
      }
      // The leader is gone; children that ignored SIGTERM (or a shell's orphans) go now.
      killGroup(pgid, "SIGKILL");
      liveGroups.delete(pgid);
    })();
    return this.stopping;
  }
}

async function answers(url: URL): Promise<boolean> {
  try {
    const response = await fetch(url, { signal: AbortSignal.timeout(2000) });
    await response.arrayBuffer();
    return response.status === 200;
  } catch {
    return false;
  }
}
