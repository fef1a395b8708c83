// Wiring a real model's text side into the server: the tokenizer's StreamingDetokenizer as the
// engine's TextDecoder, the chat template, and every end token a model names.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/request.h"
#include "model/config.h"
#include "server/openai_service.h"
#include "tokenizer/tokenizer.h"

namespace megadecode {

// Decoders backed by StreamingDetokenizer over `tokenizer` (which must outlive them).
TextDecoderFactory streaming_decoders(const Tokenizer& tokenizer);

// The ServedModel for a model directory: generation_config.json defaults, end tokens from
// config.json, generation_config.json and the tokenizer, and the Qwen3 chat template.
ServedModel served_model(const std::filesystem::path& model_dir, const std::string& name, const ModelConfig& config,
                         const Tokenizer& tokenizer);

}  // namespace megadecode
