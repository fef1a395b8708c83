// Wiring a real model's text side into the server: the engine's TextDecoders over the tokenizer
// (engine/text_decoders.h), the chat template and its output formats, and every end token a model
// names; or, for a server without a tokenizer (--skip-tokenizer-init), a model that serves token
// ids only.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "engine/text_decoders.h"
#include "model/config.h"
#include "server/openai_service.h"
#include "tokenizer/tokenizer.h"

namespace megadecode {

// The server's chat flags (vLLM's names); unset ones follow the template's family.
struct ChatFlags {
  std::optional<std::filesystem::path> chat_template;  // --chat-template FILE instead of the model's
  std::optional<std::string> tool_call_parser;  // --tool-call-parser hermes|qwen3_coder|cohere_command4|none
  std::optional<std::string> reasoning_parser;  // --reasoning-parser qwen3|cohere_command4|none
};

// The model's chat template and formats: Qwen3 parses hermes tool calls and <think> reasoning,
// Qwen3-Coder its XML tool calls, cmd4 (North) its actions and reasoning channels
// (cohere_command4). A model without a usable template serves no chat (the reason is logged and
// returned by chat requests); a bad flag value or --chat-template file is an Error.
ChatSupport chat_support(const std::filesystem::path& model_dir, const ChatFlags& flags);

// The ServedModel for a model directory: generation_config.json defaults, end tokens from
// config.json, generation_config.json and the tokenizer, and chat_support().
ServedModel served_model(const std::filesystem::path& model_dir, const std::string& name, const ModelConfig& config,
                         const Tokenizer& tokenizer, const ChatFlags& chat_flags);

// The ServedModel of a server without a tokenizer (--skip-tokenizer-init): token-id prompts and
// outputs, no chat; end tokens from config.json and generation_config.json only. An empty
// model_dir (--random-weights) has no generation_config.json: the config's end tokens alone.
ServedModel served_model_without_tokenizer(const std::filesystem::path& model_dir, const std::string& name,
                                           const ModelConfig& config);

}  // namespace megadecode
