// The dashboard's routes:
//   GET /, /dashboard            the page (index.html)
//   GET /dashboard/dashboard.js  its script, /dashboard/dashboard.css its style
//   GET /dashboard/events        server-sent events: one DashboardSnapshot as JSON every SNAPSHOT_INTERVAL_MS
//   GET /dashboard/snapshot      one snapshot as JSON (for curl and scripts)
// The page and its assets load without an API key (auth.ts lists them as
// open); the two data routes go through the same key check as the API. The
// page reads the events with fetch(), not EventSource, because EventSource
// cannot send an Authorization header and a key in the URL would end up in
// logs and history; see dashboard.js.
//
// The assets are read from src/frontend/dashboard/ under the package root
// (tsc compiles only .ts into dist/, and the checkout that runs dist/ has
// src/ beside it), once, on first use.

import { readFileSync } from "node:fs";
import type { ServerResponse } from "node:http";
import { join } from "node:path";
import type { FastifyInstance, FastifyReply } from "fastify";
import { packageRoot } from "../../transport/package-root.js";
import type { DashboardSource } from "./snapshot.js";

const SNAPSHOT_INTERVAL_MS = 500;

const ASSET_DIR = join(packageRoot, "src", "frontend", "dashboard");

const ASSETS = {
  "index.html": "text/html; charset=utf-8",
  "dashboard.js": "text/javascript; charset=utf-8",
  "dashboard.css": "text/css; charset=utf-8",
} as const;
type AssetName = keyof typeof ASSETS;

const PAGE_ROUTES: Readonly<Record<string, AssetName>> = {
  "/": "index.html",
  "/dashboard": "index.html",
  "/dashboard/dashboard.js": "dashboard.js",
  "/dashboard/dashboard.css": "dashboard.css",
};

/** Paths that serve the page itself: open without a key. */
export const DASHBOARD_PAGE_PATHS: readonly string[] = Object.keys(PAGE_ROUTES);

/** The page talks only to its own origin and runs only its own script. */
const SECURITY_HEADERS = {
  "content-security-policy":
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  "x-content-type-options": "nosniff",
  "referrer-policy": "no-referrer",
  "cache-control": "no-cache",
} as const;

export interface DashboardRouteOptions {
  /** Whether the server has an API key: the page then asks for it before reading data. */
  apiKeyRequired: boolean;
  intervalMs?: number;
}

/** Streams one snapshot per tick to every open /dashboard/events response; ticks only while someone watches. */
class SnapshotBroadcast {
  private readonly clients = new Set<ServerResponse>();
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly source: DashboardSource,
    private readonly intervalMs: number,
  ) {}

  add(res: ServerResponse): void {
    res.writeHead(200, {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      connection: "keep-alive",
      "x-accel-buffering": "no",
    });
    res.socket?.setNoDelay(true);
    this.clients.add(res);
    res.once("close", () => {
      this.clients.delete(res);
      if (this.clients.size === 0) this.stop();
    });
    // The first snapshot at once, so the page fills in without waiting a tick.
    res.write(this.event());
    this.timer ??= setInterval(() => this.tick(), this.intervalMs);
  }

  /** Ends every stream (server shutdown). */
  closeAll(): void {
    this.stop();
    for (const res of this.clients) res.end();
    this.clients.clear();
  }

  private event(): string {
    return `data: ${JSON.stringify(this.source.snapshot())}\n\n`;
  }

  private tick(): void {
    const event = this.event();
    for (const res of this.clients) {
      // A client that has not read the last snapshot skips this one.
      if (!res.writableNeedDrain) res.write(event);
    }
  }

  private stop(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }
}

export function registerDashboard(app: FastifyInstance, source: DashboardSource, options: DashboardRouteOptions): void {
  const cache = new Map<AssetName, string>();
  const asset = (name: AssetName): string => {
    let text = cache.get(name);
    if (text === undefined) {
      text = readFileSync(join(ASSET_DIR, name), "utf8");
      if (name === "index.html") text = text.replace("{{API_KEY_REQUIRED}}", options.apiKeyRequired ? "required" : "none");
      cache.set(name, text);
    }
    return text;
  };
  const send = (reply: FastifyReply, name: AssetName): FastifyReply => reply.headers(SECURITY_HEADERS).type(ASSETS[name]).send(asset(name));

  for (const [path, name] of Object.entries(PAGE_ROUTES)) app.get(path, (_request, reply) => send(reply, name));

  const broadcast = new SnapshotBroadcast(source, options.intervalMs ?? SNAPSHOT_INTERVAL_MS);
  app.get("/dashboard/snapshot", async (_request, reply) => reply.header("cache-control", "no-store").send(source.snapshot()));
  app.get("/dashboard/events", (_request, reply) => {
    reply.hijack();
    broadcast.add(reply.raw);
  });
  // Open streams would otherwise hold the server's close until its timeout.
  app.addHook("preClose", (done) => {
    broadcast.closeAll();
    done();
  });
}
