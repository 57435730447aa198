// The streaming clients of `baton bench overhead`, in a child process so that
// reading the responses does not run on the server's event loop (real clients
// are elsewhere). Driven over the fork IPC channel:
//   {type: "open", port, bodies}  -> {type: "opened", count} once every response started
//   {type: "count", seq}          -> {type: "counted", seq, tokens, atMs}: tokens received so far, on this process's clock
//   {type: "close"}               -> {type: "closed", bytes, events, tokens} after destroying them all
// Tokens are counted from each SSE event's "token_ids" array (the bench asks
// for return_token_ids), without parsing the JSON.

import { request, type ClientRequest, Agent } from "node:http";
import { performance } from "node:perf_hooks";

interface OpenMessage {
  type: "open";
  port: number;
  bodies: string[];
}
type ParentMessage = OpenMessage | { type: "count"; seq: number } | { type: "close" };

const agent = new Agent({ keepAlive: false, maxSockets: Number.POSITIVE_INFINITY });
const TOKEN_IDS = Buffer.from('"token_ids":[');
const COMMA = 44;
const CLOSE_BRACKET = 93;
const NEWLINE = 10;

let live: ClientRequest[] = [];
let bytes = 0;
let events = 0;
let tokens = 0;

function send(message: object): void {
  process.send?.(message);
}

/** Counts events and token ids in complete SSE events; returns the unfinished tail. */
function scan(data: Buffer): Buffer {
  let start = 0;
  for (let end = data.indexOf(NEWLINE); end >= 0; end = data.indexOf(NEWLINE, end + 1)) {
    if (data[end + 1] !== NEWLINE) continue;
    events++;
    const at = data.indexOf(TOKEN_IDS, start);
    if (at >= 0 && at < end) {
      let i = at + TOKEN_IDS.length;
      if (data[i] !== CLOSE_BRACKET) {
        tokens++;
        for (; i < end && data[i] !== CLOSE_BRACKET; i++) if (data[i] === COMMA) tokens++;
      }
    }
    start = end + 2;
  }
  return data.subarray(start);
}

function open({ port, bodies }: OpenMessage): void {
  let started = 0;
  for (const body of bodies) {
    const req = request(
      { host: "127.0.0.1", port, method: "POST", path: "/v1/completions", agent, headers: { "content-type": "application/json" } },
      (res) => {
        if (res.statusCode !== 200) {
          let text = "";
          res.setEncoding("utf8");
          res.on("data", (chunk: string) => (text += chunk));
          res.on("end", () => send({ type: "error", message: `HTTP ${res.statusCode}: ${text}` }));
          return;
        }
        let tail: Buffer = Buffer.alloc(0);
        res.on("data", (chunk: Buffer) => {
          bytes += chunk.length;
          tail = scan(tail.length === 0 ? chunk : Buffer.concat([tail, chunk]));
        });
        res.on("error", () => {});
        if (++started === bodies.length) send({ type: "opened", count: started });
      },
    );
    req.on("error", () => {});
    req.end(body);
    live.push(req);
  }
}

process.on("message", (message: ParentMessage) => {
  if (message.type === "open") open(message);
  else if (message.type === "count") send({ type: "counted", seq: message.seq, tokens, atMs: performance.now() });
  else if (message.type === "close") {
    for (const req of live) req.destroy();
    live = [];
    send({ type: "closed", bytes, events, tokens });
  }
});
process.on("disconnect", () => process.exit(0));
