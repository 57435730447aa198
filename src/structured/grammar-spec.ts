// What a request constrains its output to, in one form whatever API field it
// came from (response_format, structured_outputs, guided_*, a forced tool
// choice): a kind and its source text. The key names a compiled grammar in
// the grammar thread's cache; equal specs share one compilation.

type GrammarKind = "json_schema" | "json_object" | "regex" | "choice" | "ebnf" | "structural_tag";

export interface GrammarSpec {
  kind: GrammarKind;
  /** json_schema: the schema's JSON text; regex: the pattern; ebnf: the grammar; structural_tag: its JSON; choice: a JSON list of strings; json_object: "". */
  source: string;
}

export function grammarKey(spec: GrammarSpec): string {
  return `${spec.kind}\u0000${spec.source}`;
}

/** An EBNF string literal matching exactly `text` (xgrammar's EBNF escapes). */
function ebnfString(text: string): string {
  let out = '"';
  for (const ch of text) {
    const code = ch.codePointAt(0) as number;
    if (ch === '"' || ch === "\\") out += `\\${ch}`;
    else if (code < 0x20 || code === 0x7f) out += `\\x${code.toString(16).padStart(2, "0")}`;
    else out += ch;
  }
  return `${out}"`;
}

/** The EBNF grammar of a choice among strings: exactly one of them. */
export function choiceGrammar(choices: readonly string[]): string {
  return `root ::= ${choices.map(ebnfString).join(" | ")}`;
}
