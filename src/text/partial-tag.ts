// Streaming parsers (reasoning tags, tool-call markers) see text in pieces and
// must not show the start of a tag that a later piece completes. This is the
// one rule for how much of a piece's tail to hold back.

/** Length of the longest suffix of `text` that is a proper prefix of `tag` (0 when none). */
export function partialTagLength(text: string, tag: string): number {
  const most = Math.min(text.length, tag.length - 1);
  for (let n = most; n > 0; n--) {
    if (tag.startsWith(text.slice(text.length - n))) return n;
  }
  return 0;
}

/** The most any of `tags` needs held back at the end of `text`. */
export function partialTagsLength(text: string, tags: readonly string[]): number {
  let most = 0;
  for (const tag of tags) most = Math.max(most, partialTagLength(text, tag));
  return most;
}
