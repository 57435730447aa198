// The one structured logger: pino, JSON lines on stderr (stdout carries only
// the start-up banner). Per-request lines carry the request id.

import { pino, type Logger } from "pino";

export type { Logger };

export const LOG_LEVELS = ["trace", "debug", "info", "warn", "error", "fatal", "silent"] as const;
export type LogLevel = (typeof LOG_LEVELS)[number];

export function createLogger(level: LogLevel = "info"): Logger {
  return pino(
    {
      level,
      base: { pid: process.pid },
      // Lower-case level names ("info") rather than numbers; ISO times.
      formatters: { level: (label) => ({ level: label }) },
      timestamp: pino.stdTimeFunctions.isoTime,
    },
    // Synchronous: lines keep their order with the banner and survive process.exit.
    pino.destination({ dest: 2, sync: true }),
  );
}
