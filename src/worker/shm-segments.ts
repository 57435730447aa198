// Shared-memory segments of model workers (python/baton_worker/transfer/shm.py
// names them /dev/shm/baton-<pid>-<tag>). A worker unlinks its own at a clean
// exit; what a killed one leaves, the supervisor that started it removes.

import { readdirSync, statfsSync, unlinkSync } from "node:fs";
import { join } from "node:path";

const SHM_DIR = "/dev/shm";

/** Unlinks every segment worker `pid` left; returns their names. */
export function removeSegmentsOf(pid: number): string[] {
  const prefix = `baton-${pid}-`;
  let names: string[];
  try {
    names = readdirSync(SHM_DIR).filter((n) => n.startsWith(prefix));
  } catch {
    return []; // no /dev/shm here: nothing was ever created
  }
  const removed: string[] = [];
  for (const name of names) {
    try {
      unlinkSync(join(SHM_DIR, name));
      removed.push(name);
    } catch {
      // Gone meanwhile.
    }
  }
  return removed;
}

/** At most this much of the host's shared memory goes to one server's arenas. */
const HOST_BUDGET_CAP = 2 ** 31;

/**
 * Each worker's arena when `workers` workers share the host: a quarter of
 * /dev/shm (capped at 2 GiB), split evenly, so the host's use does not grow
 * with the number of workers. The files are sparse: unused space costs nothing.
 */
export function arenaShare(workers: number): number {
  let total = 0;
  try {
    const fs = statfsSync(SHM_DIR);
    total = fs.bsize * fs.blocks;
  } catch {
    return 0;
  }
  return Math.floor(Math.min(total / 4, HOST_BUDGET_CAP) / Math.max(1, workers));
}
