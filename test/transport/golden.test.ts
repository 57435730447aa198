// Golden byte vectors shared with the Python worker's tests: each .msgpack
// decodes to its .json and re-encodes to the identical bytes.

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";
import { decode, encode } from "../../src/transport/codec.js";
import { packageRoot } from "../../src/transport/package-root.js";
import { fromPlain, toPlain, type GoldenDocument } from "../../src/transport/plain.js";
import { loadSchema } from "../../src/transport/schema.js";

const goldenDir = join(packageRoot, "protocol", "golden");
const names = readdirSync(goldenDir)
  .filter((f) => f.endsWith(".msgpack"))
  .map((f) => f.slice(0, -".msgpack".length))
  .sort();

describe("golden vectors", () => {
  test("there is at least one vector per message type, each with its .json", () => {
    const files = new Set(readdirSync(goldenDir));
    const kinds = new Set<string>();
    for (const name of names) {
      assert.ok(files.has(`${name}.json`), `${name}.json is missing`);
      kinds.add((JSON.parse(readFileSync(join(goldenDir, `${name}.json`), "utf8")) as GoldenDocument).message);
    }
    assert.deepStrictEqual([...kinds].sort(), [...loadSchema().messages.keys()].sort());
  });

  for (const name of names) {
    test(name, () => {
      const bytes = readFileSync(join(goldenDir, `${name}.msgpack`));
      const doc = JSON.parse(readFileSync(join(goldenDir, `${name}.json`), "utf8")) as GoldenDocument;
      const decoded = decode(bytes);
      assert.equal(decoded.kind, doc.message);
      assert.deepStrictEqual(toPlain(decoded), doc, "decoded value matches the .json");
      assert.deepStrictEqual(decoded, fromPlain(doc), "and has the typed arrays the .json implies");
      assert.equal(encode(decoded).toString("hex"), bytes.toString("hex"), "re-encoding gives identical bytes");
    });
  }

  test("the vectors are what scripts/make-golden.mjs writes", () => {
    const run = spawnSync(process.execPath, [join(packageRoot, "scripts", "make-golden.mjs"), "--check"], { encoding: "utf8" });
    assert.equal(run.status, 0, run.stderr);
  });
});
