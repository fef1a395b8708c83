// The chat template families, each the C++ transcription of the model's Jinja template
// (used by ChatTemplate::render, which validates the input first).
#pragma once

#include <string>

#include "tokenizer/chat_template.h"

namespace megadecode {

std::string render_qwen3(const ChatInput& input);
std::string render_qwen3_coder(const ChatInput& input);
std::string render_cmd4(const ChatInput& input);

}  // namespace megadecode
