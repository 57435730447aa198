// The stop-string matcher: matches that span pieces, several stop strings,
// overlapping ones, and the holdback that keeps a stream from ever showing
// the start of a stop string that later completes.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import fc from "fast-check";
import { StopStringMatcher } from "../../src/text/stop-strings.js";

function run(stops: string[], pieces: string[], include = false): { emitted: string[]; stop: string | null } {
  const m = new StopStringMatcher(stops, include);
  const emitted: string[] = [];
  let stop: string | null = null;
  pieces.forEach((piece, i) => {
    if (stop !== null) return;
    const r = m.push(piece, i === pieces.length - 1);
    emitted.push(r.text);
    stop = r.stop;
  });
  return { emitted, stop };
}

describe("StopStringMatcher", () => {
  test("a stop string inside one piece cuts the text before it", () => {
    assert.deepEqual(run(["END"], ["abcENDxyz"]), { emitted: ["abc"], stop: "END" });
  });

  test("a stop string spanning pieces is never shown, not even its start", () => {
    const r = run(["STOP"], ["hello S", "T", "O", "P and more"]);
    assert.equal(r.stop, "STOP");
    assert.equal(r.emitted.join(""), "hello ");
    for (const piece of r.emitted) assert.ok(!/S|ST|STO/.test(piece), JSON.stringify(r.emitted));
  });

  test("held-back text is released when the stop string does not complete", () => {
    const m = new StopStringMatcher(["STOP"]);
    assert.deepEqual(m.push("ab ST"), { text: "ab ", stop: null });
    assert.equal(m.heldBack, "ST");
    assert.deepEqual(m.push("ART"), { text: "START", stop: null });
    assert.deepEqual(m.push("x S", true), { text: "x S", stop: null });
  });

  test("several stop strings: the earliest match wins, the longest on a tie", () => {
    assert.deepEqual(run(["world", "lo"], ["hello world"]), { emitted: ["hel"], stop: "lo" });
    assert.deepEqual(run(["ab", "abc"], ["xxabcd"]), { emitted: ["xx"], stop: "abc" });
  });

  test("overlapping stop strings and self-overlap (aab in aaab)", () => {
    assert.deepEqual(run(["aab"], ["a", "a", "a", "b", "z"]).emitted.join(""), "a");
    assert.equal(run(["aab"], ["a", "a", "a", "b"]).stop, "aab");
    assert.deepEqual(run(["<|a|>", "|b"], ["x<|", "b"]), { emitted: ["x", "<"], stop: "|b" });
  });

  test("a later match waits while an earlier-starting stop string may still complete", () => {
    // "abb" starts before "b": the first piece alone must not end the request on "b".
    assert.deepEqual(run(["abb", "b"], ["\n\nab", "b"]), { emitted: ["\n\n", ""], stop: "abb" });
    // ... and when it does not complete, the later match wins.
    assert.deepEqual(run(["abb", "b"], ["\n\nab", "x"]), { emitted: ["\n\n", "a"], stop: "b" });
    assert.deepEqual(run(["abb", "b"], ["\n\nab"]), { emitted: ["\n\na"], stop: "b" });
  });

  test("include_stop_str_in_output keeps the stop string", () => {
    assert.deepEqual(run(["\n\n"], ["one\n", "\ntwo"], true), { emitted: ["one", "\n\n"], stop: "\n\n" });
  });

  test("unchecked pushes (before min_tokens) release everything", () => {
    const m = new StopStringMatcher(["x"]);
    assert.deepEqual(m.push("axb", false, false), { text: "axb", stop: null });
    assert.deepEqual(m.push("cxd"), { text: "c", stop: "x" });
  });

  test("empty stop strings are refused", () => {
    assert.throws(() => new StopStringMatcher([""]));
  });

  test("property: any split of the text emits the text up to the first match, never more", () => {
    fc.assert(
      fc.property(
        fc.stringMatching(/^[ab\n]{0,30}$/),
        fc.array(fc.stringMatching(/^[ab\n]{1,3}$/), { minLength: 1, maxLength: 3 }),
        fc.array(fc.integer({ min: 0, max: 30 }), { maxLength: 6 }),
        (text, stops, cuts) => {
          const points = [...new Set(cuts.map((c) => Math.min(c, text.length)))].sort((x, y) => x - y);
          const pieces: string[] = [];
          let last = 0;
          for (const p of points) {
            pieces.push(text.slice(last, p));
            last = p;
          }
          pieces.push(text.slice(last));
          const r = run(stops, pieces);
          let first = -1;
          let firstStop: string | null = null;
          for (const s of stops) {
            const at = text.indexOf(s);
            if (at >= 0 && (first < 0 || at < first || (at === first && s.length > (firstStop?.length ?? 0)))) {
              first = at;
              firstStop = s;
            }
          }
          assert.equal(r.emitted.join(""), first < 0 ? text : text.slice(0, first));
          // Which stop string matched can depend on the split when two start at the same place ("\n" vs "\n\n").
          if (firstStop === null) assert.equal(r.stop, null);
          else assert.ok(r.stop !== null && text.startsWith(r.stop, first), `${JSON.stringify(r.stop)} at ${first}`);
        },
      ),
      { numRuns: 2000 },
    );
  });
});
