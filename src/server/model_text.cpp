// The chat support and the ServedModel builders (see model_text.h).
#include "server/model_text.h"

#include <algorithm>

#include "core/check.h"
#include "core/log.h"
#include "tokenizer/chat_template.h"

namespace megadecode {

namespace {

void add_end_token(ServedModel& m, int32_t token) {
  if (token >= 0 && std::find(m.eos_token_ids.begin(), m.eos_token_ids.end(), token) == m.eos_token_ids.end())
    m.eos_token_ids.push_back(token);
}

// What both builders share: the name, the root, generation_config.json's defaults and the end
// tokens of config.json, then generation_config.json.
ServedModel served_model_base(const std::filesystem::path& model_dir, const std::string& name,
                              const ModelConfig& config) {
  ServedModel m;
  m.name = name;
  m.root = model_dir.empty() ? name : model_dir.string();
  if (!model_dir.empty()) m.defaults = load_generation_defaults(model_dir);
  for (int t : config.eos_token_ids) add_end_token(m, t);
  for (int32_t t : m.defaults.eos_token_ids) add_end_token(m, t);
  return m;
}

}  // namespace

ChatSupport chat_support(const std::filesystem::path& model_dir, const ChatFlags& flags) {
  ChatSupport support;
  std::optional<ChatFamily> family;
  try {
    const ChatTemplate tmpl = flags.chat_template ? ChatTemplate::from_file(*flags.chat_template)
                                                  : ChatTemplate::load(model_dir);
    family = tmpl.family();
    support.render = [tmpl](const ChatInput& input) { return tmpl.render(input); };
    if (tmpl.exact()) {
      log_info("chat template: ", chat_family_name(tmpl.family()));
    } else {
      log_warn("chat template: of the ", chat_family_name(tmpl.family()), " family but not its published text; ",
               "rendered as the published template");
    }
  } catch (const Error& e) {
    if (flags.chat_template) throw;  // a template the user named must work
    support.unavailable = cat("this model serves no chat: ", e.what());
    log_warn(support.unavailable);
  }
  if (family == ChatFamily::kQwen3) support.tool_format = ToolCallFormat::kHermes;
  if (family == ChatFamily::kQwen3Coder) support.tool_format = ToolCallFormat::kQwen3Coder;
  if (family == ChatFamily::kCmd4) support.tool_format = ToolCallFormat::kCohereCommand4;
  if (family == ChatFamily::kQwen3) support.reasoning_format = ReasoningFormat::kQwen3;
  if (family == ChatFamily::kCmd4) support.reasoning_format = ReasoningFormat::kCohereCommand4;
  if (flags.tool_call_parser) {
    const std::string& name = *flags.tool_call_parser;
    support.tool_format = tool_call_format_from_name(name);
    MD_REQUIRE(support.tool_format || name == "none", "--tool-call-parser must be hermes, qwen3_coder (qwen3_xml), ",
               "cohere_command4 or none, got \"", name, "\"");
  }
  if (flags.reasoning_parser) {
    const std::string& name = *flags.reasoning_parser;
    support.reasoning_format = reasoning_format_from_name(name);
    MD_REQUIRE(support.reasoning_format || name == "none", "--reasoning-parser must be qwen3, cohere_command4 or none, ",
               "got \"", name, "\"");
  }
  return support;
}

ServedModel served_model(const std::filesystem::path& model_dir, const std::string& name, const ModelConfig& config,
                         const Tokenizer& tokenizer, const ChatFlags& chat_flags) {
  ChatSupport chat = chat_support(model_dir, chat_flags);  // first: a bad chat flag is the error to report
  ServedModel m = served_model_base(model_dir, name, config);
  m.tokenizer = &tokenizer;
  m.chat = std::move(chat);
  if (auto eos = tokenizer.eos_token_id()) add_end_token(m, *eos);
  return m;
}

ServedModel served_model_without_tokenizer(const std::filesystem::path& model_dir, const std::string& name,
                                           const ModelConfig& config) {
  return served_model_base(model_dir, name, config);  // no tokenizer: the service serves token ids only
}

}  // namespace megadecode
