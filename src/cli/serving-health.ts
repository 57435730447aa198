// What the server says about itself while workers die and come back: which
// workers are down (by replica and rank, with why), and from that whether the
// server is unavailable (/health 503, new requests 503), degraded (/health
// 200 with a message: some data-parallel replicas are down, the others
// serve) or must stop (every replica gave up restarting).
//
// One engine (one replica): unavailable while any of its workers is down;
// stop when it gives up. Data parallel: unavailable only while every replica
// has a worker down; a replica that gave up stays down for good, and the
// server stops when all have.

import type { WorkerHealthEvent } from "../worker/types.js";

export interface HealthState {
  unavailable: string | null;
  degraded: string | null;
}

export interface HealthUpdate {
  /** One line for the log, and how loud. */
  log: { line: string; level: "info" | "error" };
  /** The server's state after the event. */
  state: HealthState;
  /** Set when the server must stop (exit 1): why. */
  stop: string | null;
}

export class ServingHealth {
  /** Replica -> rank -> why it is down. */
  private readonly down = new Map<number, Map<number, string>>();
  private readonly gaveUp = new Set<number>();

  constructor(
    private readonly replicaCount: number,
    private readonly ranksPerReplica: number,
  ) {}

  apply(event: WorkerHealthEvent): HealthUpdate {
    const replica = event.replica ?? 0;
    const worker = this.ranksPerReplica === 1 ? "the model worker" : `the model worker of rank ${event.rank}`;
    const which = this.replicaCount === 1 ? worker : `${worker} of replica ${replica}`;
    const downHere = this.down.get(replica) ?? new Map<number, string>();
    this.down.set(replica, downHere);
    let log: HealthUpdate["log"];
    let stop: string | null = null;
    switch (event.kind) {
      case "down": {
        const reason = `${which} died: ${event.exit.summary}; restarting it in ${event.restartInMs / 1000} s`;
        downHere.set(event.rank, reason);
        log = { line: reason, level: "error" };
        break;
      }
      case "up":
        downHere.delete(event.rank);
        log = { line: `${which} is serving again (pid ${event.pid}, restart ${event.restarts})`, level: "info" };
        break;
      case "gave-up":
        this.gaveUp.add(replica);
        downHere.set(event.rank, this.replicaCount === 1 ? event.message : `replica ${replica}: ${event.message}`);
        if (this.gaveUp.size === this.replicaCount) {
          stop = event.message;
          log = { line: `${event.message}; giving up`, level: "error" };
        } else {
          log = { line: `${event.message}; replica ${replica} is out of service, the other replicas go on serving`, level: "error" };
        }
        break;
    }
    return { log, state: this.state(), stop };
  }

  private state(): HealthState {
    const reasons = [...this.down.values()].flatMap((m) => [...m.values()]);
    const replicasDown = [...this.down.values()].filter((m) => m.size > 0).length;
    if (replicasDown === this.replicaCount) return { unavailable: reasons.join("; "), degraded: null };
    if (replicasDown === 0) return { unavailable: null, degraded: null };
    return { unavailable: null, degraded: `serving on ${this.replicaCount - replicasDown} of ${this.replicaCount} replicas: ${reasons.join("; ")}` };
  }
}
