// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (Qwen2/Qwen3 and North / Command
// style pipelines) and a streaming detokenizer (the chat template is tokenizer/chat_template.h).
// Thread-safety: a loaded Tokenizer is immutable apart from an internal, locked BPE cache, so
// any number of threads may encode/decode concurrently.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace megadecode {

class Tokenizer {
 public:
  // Reads model_dir/tokenizer.json and model_dir/tokenizer_config.json. Error names the file.
  static std::unique_ptr<Tokenizer> load(const std::filesystem::path& model_dir);
  virtual ~Tokenizer() = default;

  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const = 0;
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;

  virtual int vocab_size() const = 0;                                    // highest id + 1
  virtual std::optional<int32_t> token_id(std::string_view token) const = 0;  // e.g. "<|im_end|>"
  virtual bool is_special(int32_t id) const = 0;
  // The bytes token `id` stands for (byte-level decoded); may be part of a UTF-8 character.
  virtual std::string token_bytes(int32_t id) const = 0;
  // The eos token named by tokenizer_config.json, if any.
  virtual std::optional<int32_t> eos_token_id() const = 0;
  // Added tokens (special or not, e.g. "<think>") decode as their literal text, separately from
  // the byte-level stream around them.
  virtual bool is_added_token(int32_t id) const { return is_special(id); }
};

// Fed one token at a time, returns the text that became complete: never splits a UTF-8
// character; the concatenation of all push() results and flush() equals decode(all ids).
class StreamingDetokenizer {
 public:
  StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens);
  std::string push(int32_t id);
  std::string flush();  // whatever is left (invalid trailing bytes decoded as decode() would)

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes not yet emitted: a truncated UTF-8 character (at most 3 bytes)
};

}  // namespace megadecode
