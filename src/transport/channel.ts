// The engine side of the engine <-> worker link: a ZeroMQ PUSH socket the
// engine sends on (bound at inEndpoint, the worker's input) and a PULL socket
// it receives on (bound at outEndpoint, the worker's output). The engine binds
// both so a restarted worker can simply connect again, and so the endpoints
// exist before the worker is spawned.

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Pull, Push } from "zeromq";
import { decodeWorkerMessage, encode } from "./codec.js";
import type { EngineToWorkerMessage, WorkerToEngineMessage } from "./messages.js";

export interface ChannelOptions {
  /**
   * "ipc" (default): unix sockets in a fresh temp directory, removed on close.
   * "tcp": loopback TCP on ephemeral ports. Or pass explicit endpoints.
   */
  transport?: "ipc" | "tcp";
  inEndpoint?: string;
  outEndpoint?: string;
  /** Every decoded message from the worker, in arrival order. */
  onMessage: (message: WorkerToEngineMessage) => void;
  /** A frame that failed to decode (ProtocolError) or a socket failure. The loop keeps running. */
  onError: (error: Error) => void;
}

/**
 * Wall time of the last encode (send) and decode (receive) in this process, for
 * benchmarks: two performance.now() calls per message, no allocation.
 */
export const codecTimings = { encodeMs: 0, decodeMs: 0, encodeBytes: 0, decodeBytes: 0 };

export class EngineChannel {
  private readonly push: Push;
  private readonly pull: Pull;
  private sendChain: Promise<void> = Promise.resolve();
  private closed = false;
  private readonly receiving: Promise<void>;

  private constructor(
    push: Push,
    pull: Pull,
    /** Where the worker connects its PULL socket (engine -> worker). */
    readonly inEndpoint: string,
    /** Where the worker connects its PUSH socket (worker -> engine). */
    readonly outEndpoint: string,
    private readonly tempDir: string | null,
    private readonly options: ChannelOptions,
  ) {
    this.push = push;
    this.pull = pull;
    this.receiving = this.receiveLoop();
  }

  /** Binds both sockets and starts the receive loop. */
  static async bind(options: ChannelOptions): Promise<EngineChannel> {
    // linger 0: close() drops anything unsent instead of keeping Node alive for it.
    const push = new Push({ linger: 0 });
    const pull = new Pull({ linger: 0 });
    let tempDir: string | null = null;
    try {
      let inEndpoint = options.inEndpoint;
      let outEndpoint = options.outEndpoint;
      if (inEndpoint === undefined || outEndpoint === undefined) {
        if ((options.transport ?? "ipc") === "ipc") {
          // Unix socket paths are limited to ~107 bytes, so keep the directory short.
          tempDir = mkdtempSync(join(tmpdir(), "baton-"));
          inEndpoint ??= `ipc://${join(tempDir, "in")}`;
          outEndpoint ??= `ipc://${join(tempDir, "out")}`;
        } else {
          inEndpoint ??= "tcp://127.0.0.1:*";
          outEndpoint ??= "tcp://127.0.0.1:*";
        }
      }
      await push.bind(inEndpoint);
      await pull.bind(outEndpoint);
      // For tcp://...:* the real port is only known after bind.
      return new EngineChannel(push, pull, push.lastEndpoint ?? inEndpoint, pull.lastEndpoint ?? outEndpoint, tempDir, options);
    } catch (error) {
      push.close();
      pull.close();
      if (tempDir !== null) rmSync(tempDir, { recursive: true, force: true });
      throw new Error(`cannot bind the worker channel: ${(error as Error).message}`);
    }
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /**
   * Queues a message for the worker. Sends are serialized because a ZeroMQ
   * socket allows only one pending send; the promise settles when the message
   * is handed to ZeroMQ (not when the worker has read it).
   */
  send(message: EngineToWorkerMessage): Promise<void> {
    if (this.closed) return Promise.reject(new Error("worker channel is closed"));
    // Encode now so a bad message fails at the caller, with its field named.
    const t0 = performance.now();
    const frame = encode(message);
    codecTimings.encodeMs = performance.now() - t0;
    codecTimings.encodeBytes = frame.byteLength;
    const sent = this.sendChain.then(() => {
      if (this.closed) throw new Error("worker channel is closed");
      return this.push.send(frame);
    });
    this.sendChain = sent.catch(() => {});
    return sent;
  }

  private async receiveLoop(): Promise<void> {
    while (!this.closed) {
      let frames: Buffer[];
      try {
        frames = await this.pull.receive();
      } catch (error) {
        // Closing the socket ends a pending receive with an error; that is the normal way out.
        if (this.closed || this.pull.closed) return;
        this.options.onError(error as Error);
        continue;
      }
      if (this.closed) return;
      const frame = frames[0];
      if (frames.length !== 1 || frame === undefined) {
        this.options.onError(new Error(`worker sent a ${frames.length}-part ZeroMQ message; expected 1`));
        continue;
      }
      let message: WorkerToEngineMessage;
      try {
        const t0 = performance.now();
        message = decodeWorkerMessage(frame);
        codecTimings.decodeMs = performance.now() - t0;
        codecTimings.decodeBytes = frame.byteLength;
      } catch (error) {
        this.options.onError(error as Error);
        continue;
      }
      this.options.onMessage(message);
    }
  }

  /**
   * Synchronous last-resort cleanup for 'exit' hooks, where close() cannot be
   * awaited: closes both sockets and removes the ipc socket directory. (A
   * thread must not end with its sockets open: zeromq.js aborts the process,
   * zeromq/zeromq.js#411.)
   */
  closeSync(): void {
    this.closed = true;
    this.push.close();
    this.pull.close();
    if (this.tempDir !== null) rmSync(this.tempDir, { recursive: true, force: true });
  }

  /** Closes both sockets (dropping unsent messages) and removes the ipc directory. Idempotent. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.push.close();
    this.pull.close();
    await this.receiving.catch(() => {});
    if (this.tempDir !== null) rmSync(this.tempDir, { recursive: true, force: true });
  }
}
