// The engine-side ZeroMQ channel against a stand-in worker made of plain
// zeromq sockets (the real Python worker is exercised in test/worker/).

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { describe, test } from "node:test";
import { Pull, Push } from "zeromq";
import { EngineChannel } from "../../src/transport/channel.js";
import { decodeEngineMessage, encode } from "../../src/transport/codec.js";
import { ProtocolError, type WorkerToEngineMessage } from "../../src/transport/messages.js";
import { result, step } from "./fixtures.js";

interface Harness {
  channel: EngineChannel;
  received: WorkerToEngineMessage[];
  errors: Error[];
  /** The stand-in worker's sockets. */
  workerIn: Pull;
  workerOut: Push;
  close(): Promise<void>;
}

async function harness(transport: "ipc" | "tcp"): Promise<Harness> {
  const received: WorkerToEngineMessage[] = [];
  const errors: Error[] = [];
  const channel = await EngineChannel.bind({ transport, onMessage: (m) => received.push(m), onError: (e) => errors.push(e) });
  const workerIn = new Pull({ linger: 0 });
  const workerOut = new Push({ linger: 0 });
  workerIn.connect(channel.inEndpoint);
  workerOut.connect(channel.outEndpoint);
  return {
    channel,
    received,
    errors,
    workerIn,
    workerOut,
    async close() {
      workerIn.close();
      workerOut.close();
      await channel.close();
    },
  };
}

async function until(condition: () => boolean, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error("timed out waiting");
    await new Promise((r) => setTimeout(r, 5));
  }
}

for (const transport of ["ipc", "tcp"] as const) {
  describe(`channel over ${transport}`, () => {
    test("endpoints are concrete", async () => {
      const h = await harness(transport);
      try {
        const pattern = transport === "ipc" ? /^ipc:\/\/\/.+\/in$/ : /^tcp:\/\/127\.0\.0\.1:\d+$/;
        assert.match(h.channel.inEndpoint, pattern);
        assert.match(h.channel.outEndpoint, transport === "ipc" ? /^ipc:\/\/\/.+\/out$/ : pattern);
        assert.notEqual(h.channel.inEndpoint, h.channel.outEndpoint);
      } finally {
        await h.close();
      }
    });

    test("messages flow both ways, in order", async () => {
      const h = await harness(transport);
      try {
        const sends = [h.channel.send(step({ step_id: 1 })), h.channel.send(step({ step_id: 2 })), h.channel.send({ kind: "Ping", nonce: 9 })];
        await Promise.all(sends);
        const got = [];
        for (let i = 0; i < 3; i++) {
          const [frame] = await h.workerIn.receive();
          got.push(decodeEngineMessage(frame!));
        }
        assert.deepStrictEqual(got, [step({ step_id: 1 }), step({ step_id: 2 }), { kind: "Ping", nonce: 9 }]);

        await h.workerOut.send(encode(result({ step_id: 1 })));
        await h.workerOut.send(encode({ kind: "Pong", nonce: 9 }));
        await until(() => h.received.length === 2);
        assert.deepStrictEqual(h.received, [result({ step_id: 1 }), { kind: "Pong", nonce: 9 }]);
      } finally {
        await h.close();
      }
    });

    test("a malformed frame is reported and the loop goes on", async () => {
      const h = await harness(transport);
      try {
        await h.workerOut.send(Buffer.from("not msgpack at all"));
        await h.workerOut.send(encode({ kind: "Ping", nonce: 1 })); // an engine message from the worker
        await h.workerOut.send([encode({ kind: "Pong", nonce: 1 }), Buffer.from("x")]); // two parts
        await h.workerOut.send(encode({ kind: "Pong", nonce: 2 }));
        await until(() => h.received.length === 1);
        assert.deepStrictEqual(h.received, [{ kind: "Pong", nonce: 2 }]);
        assert.equal(h.errors.length, 3);
        assert.ok(h.errors[0] instanceof ProtocolError);
        assert.match(h.errors[1]!.message, /Ping is not a worker message/);
        assert.match(h.errors[2]!.message, /2-part ZeroMQ message/);
      } finally {
        await h.close();
      }
    });
  });
}

describe("closing", () => {
  test("removes the ipc directory, rejects later sends, and is idempotent", async () => {
    const h = await harness("ipc");
    const dir = h.channel.inEndpoint.slice("ipc://".length).replace(/\/in$/, "");
    assert.ok(existsSync(dir));
    await h.close();
    await h.channel.close();
    assert.equal(existsSync(dir), false);
    assert.equal(h.channel.isClosed, true);
    await assert.rejects(h.channel.send({ kind: "Shutdown" }), /closed/);
  });

  test("a send waiting for a peer that never connects is dropped on close", async () => {
    const channel = await EngineChannel.bind({ onMessage: () => {}, onError: () => {} });
    const pending = channel.send({ kind: "Ping", nonce: 1 });
    await channel.close();
    await assert.rejects(pending);
  });

  test("a bad message fails at send with its field named", async () => {
    const h = await harness("ipc");
    try {
      assert.throws(() => h.channel.send({ kind: "Ping", nonce: 0.5 }), { name: "ProtocolError", message: "Ping.nonce: expected int, got float" });
    } finally {
      await h.close();
    }
  });
});
