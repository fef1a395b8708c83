// streaming_decoders and no_text_decoders (see text_decoders.h).
#include "engine/text_decoders.h"

#include <memory>
#include <string>

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

class NoTextDecoder : public TextDecoder {
 public:
  std::string push(int32_t /*token*/) override { return ""; }
  std::string flush() override { return ""; }
};

}  // namespace

TextDecoderFactory streaming_decoders(const Tokenizer& tokenizer) {
  return [&tokenizer](bool skip_special) { return std::make_unique<StreamingTextDecoder>(tokenizer, skip_special); };
}

TextDecoderFactory no_text_decoders() {
  return [](bool /*skip_special*/) { return std::make_unique<NoTextDecoder>(); };
}

}  // namespace megadecode
