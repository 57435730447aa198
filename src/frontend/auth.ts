// API-key authentication (--api-key / BATON_API_KEY): every route but
// /health and the dashboard page (its data routes do) needs `Authorization:
// Bearer <key>`. Keys are compared as SHA-256 digests with
// crypto.timingSafeEqual, so neither the key's content nor its length leaks
// through timing.

import { createHash, timingSafeEqual } from "node:crypto";
import type { FastifyReply, FastifyRequest } from "fastify";
import { DASHBOARD_PAGE_PATHS } from "./dashboard/routes.js";

/** Routes anyone may call: load balancers' health checks, and the dashboard page (not its data). */
const OPEN_ROUTES: ReadonlySet<string> = new Set(["/health", ...DASHBOARD_PAGE_PATHS]);

function digest(text: string): Buffer {
  return createHash("sha256").update(text, "utf8").digest();
}

/** True when `presented` equals the key; constant time in both. */
export function keyMatches(expectedDigest: Buffer, presented: string): boolean {
  return timingSafeEqual(expectedDigest, digest(presented));
}

function unauthorizedBody(message: string): object {
  return { error: { message, type: "invalid_request_error", param: null, code: "invalid_api_key" } };
}

/** A fastify onRequest hook that answers 401 unless the bearer token is the key. */
export function apiKeyHook(apiKey: string, onReject?: () => void) {
  const expected = digest(apiKey);
  return (request: FastifyRequest, reply: FastifyReply, done: () => void): void => {
    const path = request.url.split("?", 1)[0] ?? "";
    if (OPEN_ROUTES.has(path)) {
      done();
      return;
    }
    const header = request.headers.authorization;
    const match = typeof header === "string" ? /^Bearer\s+(.+)$/i.exec(header.trim()) : null;
    if (match?.[1] !== undefined && keyMatches(expected, match[1])) {
      done();
      return;
    }
    onReject?.();
    const message =
      header === undefined
        ? "missing API key: send the header 'Authorization: Bearer <key>'"
        : "invalid API key";
    void reply.code(401).header("www-authenticate", "Bearer").send(unauthorizedBody(message));
  };
}
