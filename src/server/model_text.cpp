// streaming_decoders and served_model (see model_text.h).
#include "server/model_text.h"

#include <algorithm>

#include "core/check.h"

namespace megadecode {

namespace {

// A model's vocabulary is often padded past the tokenizer's (Qwen3: 151936 vs 151669 ids); a
// sampled id with no token decodes to nothing, as in vLLM, instead of failing the sequence.
class StreamingTextDecoder : public TextDecoder {
 public:
  StreamingTextDecoder(const Tokenizer& tokenizer, bool skip_special)
      : tokenizer_(tokenizer), detok_(tokenizer, skip_special) {}
  std::string push(int32_t token) override {
    if (!has_text(token)) return "";
    return detok_.push(token);
  }
  std::string flush() override { return detok_.flush(); }

 private:
  bool has_text(int32_t token) const {
    if (token < 0 || token >= tokenizer_.vocab_size()) return false;
    try {
      tokenizer_.token_bytes(token);
      return true;
    } catch (const Error&) {
      return false;  // an id inside the range that no token uses
    }
  }
  const Tokenizer& tokenizer_;
  StreamingDetokenizer detok_;
};

}  // namespace

TextDecoderFactory streaming_decoders(const Tokenizer& tokenizer) {
  return [&tokenizer](bool skip_special) { return std::make_unique<StreamingTextDecoder>(tokenizer, skip_special); };
}

ServedModel served_model(const std::filesystem::path& model_dir, const std::string& name, const ModelConfig& config,
                         const Tokenizer& tokenizer) {
  ServedModel m;
  m.name = name;
  m.root = model_dir.string();
  m.tokenizer = &tokenizer;
  m.render_chat = [](std::span<const ChatMessage> messages, bool add_generation_prompt) {
    return render_chat(messages, add_generation_prompt);
  };
  m.defaults = load_generation_defaults(model_dir);
  auto add = [&](int32_t t) {
    if (t >= 0 && std::find(m.eos_token_ids.begin(), m.eos_token_ids.end(), t) == m.eos_token_ids.end())
      m.eos_token_ids.push_back(t);
  };
  for (int t : config.eos_token_ids) add(t);
  for (int32_t t : m.defaults.eos_token_ids) add(t);
  if (auto eos = tokenizer.eos_token_id()) add(*eos);
  return m;
}

}  // namespace megadecode
