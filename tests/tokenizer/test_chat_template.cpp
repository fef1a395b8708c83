// The chat templates on hand-checked cases: Python's value semantics (json.dumps, str(), float
// repr, str.strip), both families' renderings of tools, calls, results and reasoning, the
// template flags, the errors, and where a model's template is read from.
#include <fstream>

#include <gtest/gtest.h>

#include "core/check.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/template_values.h"
#include "tokenizer_test_util.h"

namespace megadecode {
namespace {

namespace tv = template_values;
using OJson = nlohmann::ordered_json;

ChatMessage msg(std::string role, std::string content) { return ChatMessage{std::move(role), std::move(content), {}, {}, {}}; }

ChatInput chat(std::vector<ChatMessage> messages, bool add_generation_prompt = true) {
  ChatInput in;
  in.messages = std::move(messages);
  in.add_generation_prompt = add_generation_prompt;
  return in;
}

const ChatTemplate& qwen3() {
  static const ChatTemplate t = ChatTemplate::load(testing::qwen3_dir());
  return t;
}
const ChatTemplate& coder() {
  static const ChatTemplate t =
      ChatTemplate::from_file(std::filesystem::path(MEGADECODE_SOURCE_DIR) / "tests/data/qwen3_coder_chat_template.jinja");
  return t;
}

TEST(TemplateValues, PythonSpellings) {
  EXPECT_EQ(tv::to_json(OJson::parse(R"({"b": [1, 2.5, null, true], "a": "é\n\u0001\"", "c": {}})")),
            "{\"b\": [1, 2.5, null, true], \"a\": \"é\\n\\u0001\\\"\", \"c\": {}}");
  EXPECT_EQ(tv::to_str(OJson::parse(R"(["integer", "null"])")), "['integer', 'null']");
  EXPECT_EQ(tv::to_str(OJson::parse(R"({"k": [true, false, null, "it's", "a\"b'c"]})")),
            "{'k': [True, False, None, \"it's\", 'a\"b\\'c']}");
  EXPECT_EQ(tv::to_str(OJson("naïve")), "naïve");  // a bare string is itself
  EXPECT_THROW(tv::to_str(OJson::parse(R"(["naïve"])")), Error);
  for (const auto& [d, text] : std::vector<std::pair<double, std::string>>{
           {0.1, "0.1"}, {1.0, "1.0"}, {-2.5, "-2.5"}, {1e-4, "0.0001"}, {1e-5, "1e-05"}, {1.5e-7, "1.5e-07"},
           {123456789012345.6, "123456789012345.6"}, {1e15, "1000000000000000.0"}, {1e16, "1e+16"}, {1e22, "1e+22"},
           {5e-324, "5e-324"}, {1.7976931348623157e308, "1.7976931348623157e+308"}, {-0.0, "-0.0"}}) {
    EXPECT_EQ(tv::float_repr(d), text) << d;
  }
  // str.strip(): Python's whitespace (U+3000, U+0085, U+001F), not U+FEFF (JavaScript's trim).
  EXPECT_EQ(tv::strip("\u3000\u0085 a b\x1f\n"), "a b");
  EXPECT_EQ(tv::strip("\ufeffx\ufeff"), "\ufeffx\ufeff");
  EXPECT_EQ(tv::strip_chars("\n\n x \n", "\n"), " x ");
}

TEST(ChatTemplate, Qwen3PlainChat) {
  EXPECT_EQ(qwen3().render(chat({msg("system", "S"), msg("user", "hi")})),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(qwen3().render(chat({msg("user", "hi")}, false)), "<|im_start|>user\nhi<|im_end|>\n");
  // History: reasoning of earlier turns is dropped; the final assistant turn keeps a think block.
  EXPECT_EQ(qwen3().render(chat({msg("user", "q1"), msg("assistant", "<think>\nr1\n</think>\n\na1"), msg("user", "q2"),
                                 msg("assistant", "\n\na2")})),
            "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nq2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\na2<|im_end|>\n<|im_start|>assistant\n");
  // Only newlines are stripped around the reasoning and the answer (Python str.strip("\n")).
  EXPECT_EQ(qwen3().render(chat({msg("user", "q"), msg("assistant", "<think>\n \nr\n</think>\n\n  ans")}, false)),
            "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n \nr\n</think>\n\n  ans<|im_end|>\n");
  // reasoning_content replaces the split; thinking off adds an empty think block to the prompt.
  ChatInput in = chat({msg("user", "q"), msg("assistant", "a")});
  in.messages[1].reasoning_content = "\nr\n";
  in.enable_thinking = false;
  EXPECT_EQ(qwen3().render(in), "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\na<|im_end|>\n"
                                "<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, Qwen3ToolsCallsAndResults) {
  ChatInput in = chat({msg("system", "Be useful."), msg("user", "Weather?"), msg("assistant", ""), msg("tool", "sunny"),
                       msg("tool", "warm")});
  in.tools = OJson::parse(R"([{"type": "function", "function": {"name": "w", "parameters": {"x": 1.5}}}])");
  in.messages[2].tool_calls.push_back({"c1", "w", OJson::parse(R"({"city": "Oslo"})")});
  in.messages[2].tool_calls.push_back({"c2", "w", OJson::object()});
  EXPECT_EQ(qwen3().render(in),
            "<|im_start|>system\nBe useful.\n\n# Tools\n\nYou may call one or more functions to assist with the user query."
            "\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            "{\"type\": \"function\", \"function\": {\"name\": \"w\", \"parameters\": {\"x\": 1.5}}}\n</tools>\n\n"
            "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
            "XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
            "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n"
            "{\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"w\", "
            "\"arguments\": {}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
            "<tool_response>\nwarm\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, Qwen3CoderToolsCallsAndResults) {
  ChatInput in = chat({msg("user", "Write it."), msg("assistant", "  Sure.  "), msg("tool", "ok"), msg("user", "Thanks")});
  in.tools = OJson::parse(R"([{"type": "function", "function": {"name": "write", "description": " Writes. ",
      "parameters": {"type": "object", "properties": {"path": {"type": ["string", "null"], "description": "Where",
      "default": null, "enum": ["a", "b"]}}, "required": ["path"], "additionalProperties": false}, "strict": true}}])");
  in.messages[1].tool_calls.push_back({"c1", "write", OJson::parse(R"({"path": "/a", "n": 2.5, "f": true, "o": {"k": [1]}})")});
  in.enable_thinking = false;  // not a variable of this template
  EXPECT_EQ(coder().render(in),
            "<|im_start|>system\nYou are Qwen, a helpful AI assistant that can interact with a computer to solve tasks.\n\n"
            "# Tools\n\nYou have access to the following functions:\n\n<tools>\n<function>\n<name>write</name>\n"
            "<description>Writes.</description>\n<parameters>\n<parameter>\n<name>path</name>\n<type>['string', 'null']</type>\n"
            "<description>Where</description>\n<default>None</default>\n<enum>[\"a\", \"b\"]</enum>\n</parameter>\n"
            "<required>[\"path\"]</required>\n<additionalProperties>False</additionalProperties>\n</parameters>\n"
            "<strict>True</strict>\n</function>\n</tools>\n\nIf you choose to call a function ONLY reply in the following "
            "format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\n"
            "value_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can "
            "span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST "
            "follow the specified format: an inner <function=...></function> block must be nested within "
            "<tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional "
            "reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no "
            "function call available, answer the question like normal with your current knowledge and do not tell the user "
            "about function calls\n</IMPORTANT><|im_end|>\n<|im_start|>user\nWrite it.<|im_end|>\n<|im_start|>assistant\n"
            "Sure.\n\n<tool_call>\n<function=write>\n<parameter=path>\n/a\n</parameter>\n<parameter=n>\n2.5\n</parameter>\n"
            "<parameter=f>\nTrue\n</parameter>\n<parameter=o>\n{\"k\": [1]}\n</parameter>\n</function>\n</tool_call>"
            "<|im_end|>\n<|im_start|>user\n<tool_response>\nok\n</tool_response>\n<|im_end|>\n<|im_start|>user\nThanks"
            "<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, ContinueFinalMessage) {
  ChatInput in = chat({msg("user", "q"), msg("assistant", "The answer is ")}, false);
  in.continue_final_message = true;
  EXPECT_EQ(coder().render(in), "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nThe answer is ");
  EXPECT_EQ(qwen3().render(in), "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nThe answer is ");
  in.messages[1].content = "<think>r</think>x";  // the template drops the tags: nothing to continue
  EXPECT_THROW(qwen3().render(in), Error);
}

TEST(ChatTemplate, RefusedInputs) {
  EXPECT_THROW(qwen3().render(chat({})), Error);
  EXPECT_THROW(qwen3().render(chat({msg("wizard", "x")})), Error);
  ChatInput user_calls = chat({msg("user", "x")});
  user_calls.messages[0].tool_calls.push_back({"c", "f", OJson::object()});
  EXPECT_THROW(coder().render(user_calls), Error);
  ChatInput both = chat({msg("user", "x")});
  both.continue_final_message = true;
  EXPECT_THROW(qwen3().render(both), Error);
}

TEST(ChatTemplate, WhereTheTemplateComesFrom) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("megadecode-chat-template-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string coder_text = [] {
    std::ifstream in(std::filesystem::path(MEGADECODE_SOURCE_DIR) / "tests/data/qwen3_coder_chat_template.jinja");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  EXPECT_THROW(ChatTemplate::load(dir), Error);  // no template at all
  std::ofstream(dir / "tokenizer_config.json") << OJson{{"chat_template", OJson::array({{{"name", "default"}, {"template", coder_text}}})}}.dump();
  EXPECT_EQ(ChatTemplate::load(dir).family(), ChatFamily::kQwen3Coder);
  EXPECT_TRUE(ChatTemplate::load(dir).exact());
  // chat_template.jinja wins over tokenizer_config.json, as in transformers.
  std::ofstream(dir / "chat_template.jinja") << "{{ messages }}";
  EXPECT_THROW(ChatTemplate::load(dir), Error);
  // A template of the family that differs elsewhere is still of the family, but not exact.
  EXPECT_EQ(ChatTemplate::from_text(coder_text + "\n").family(), ChatFamily::kQwen3Coder);
  EXPECT_TRUE(ChatTemplate::from_text(coder_text + "\n").exact());  // trailing newlines do not count
  EXPECT_FALSE(ChatTemplate::from_text("{#- edited -#}" + coder_text).exact());
  EXPECT_TRUE(qwen3().exact());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace megadecode
