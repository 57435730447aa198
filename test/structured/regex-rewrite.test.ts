// The regex spelling handed to xgrammar (X+ as XX* for single-character
// atoms) matches exactly the strings the request's regex matches.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import fc from "fast-check";
import { rewriteRegexForXGrammar } from "../../src/structured/regex-rewrite.js";

describe("rewriteRegexForXGrammar", () => {
  test("single-character atoms under + become XX*; everything else is left alone", () => {
    const cases: [string, string][] = [
      ["[a-z ,.]+", "[a-z ,.][a-z ,.]*"],
      ["\\d+-\\w+", "\\d\\d*-\\w\\w*"],
      ["a+b.+", "aa*b..*"],
      ["(ab)+c", "(ab)+c"],
      ["[+]\\++", "[+]\\+\\+*"],
      ["[]a]+[^]]+", "[]a][]a]*[^]][^]]*"],
      ["a+?b++", "a+?b++"],
      ["\\x41+\\u0041+\\p{L}+", "\\x41+\\u0041+\\p{L}+"],
      ["[[:alpha:]]+", "[[:alpha:]]+"],
      ["a{2,}+", "a{2,}+"],
      ["\\1+", "\\1+"],
    ];
    for (const [input, expected] of cases) assert.equal(rewriteRegexForXGrammar(input), expected, input);
  });

  test("the rewritten regex matches the same strings (JavaScript's regex engine as the judge)", () => {
    const atom = fc.constantFrom("a", "b", ".", "[ab]", "[^a]", "\\d", "\\w", "\\s", "[a-c ,]", "\\.", "\\+", "(ab)", "(a|b)");
    const quantifier = fc.constantFrom("", "+", "*", "?", "{1,2}");
    const regex = fc.array(fc.tuple(atom, quantifier).map(([a, q]) => a + q), { minLength: 1, maxLength: 5 }).map((parts) => parts.join(""));
    fc.assert(
      fc.property(regex, fc.array(fc.string({ unit: fc.constantFrom("a", "b", "c", "1", " ", ",", ".", "+", "x") }), { minLength: 20, maxLength: 20 }), (pattern, inputs) => {
        const original = new RegExp(`^(?:${pattern})$`);
        const rewritten = new RegExp(`^(?:${rewriteRegexForXGrammar(pattern)})$`);
        for (const input of inputs) assert.equal(rewritten.test(input), original.test(input), `${pattern} vs ${rewriteRegexForXGrammar(pattern)} on ${JSON.stringify(input)}`);
      }),
      { numRuns: 500 },
    );
  });
});
