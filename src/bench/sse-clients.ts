// The streaming clients of `baton bench overhead`, in a child process so that
// parsing the responses does not run on the server's event loop (real clients
// are elsewhere). Driven over the fork IPC channel:
//   {type: "open", port, count, bodies}  -> {type: "opened", count} once every response started
//   {type: "close"}                      -> {type: "closed", bytes, events} after destroying them all

import { request, type ClientRequest, Agent } from "node:http";

interface OpenMessage {
  type: "open";
  port: number;
  bodies: string[];
}
type ParentMessage = OpenMessage | { type: "close" };

const agent = new Agent({ keepAlive: false, maxSockets: Number.POSITIVE_INFINITY });
let live: ClientRequest[] = [];
let bytes = 0;
let events = 0;

function send(message: object): void {
  process.send?.(message);
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
        res.on("data", (chunk: Buffer) => {
          bytes += chunk.length;
          // Count SSE events without parsing JSON: one blank line ends each.
          for (let i = chunk.indexOf(10); i >= 0; i = chunk.indexOf(10, i + 1)) if (chunk[i + 1] === 10) events++;
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
  else if (message.type === "close") {
    for (const req of live) req.destroy();
    live = [];
    send({ type: "closed", bytes, events });
  }
});
process.on("disconnect", () => process.exit(0));
