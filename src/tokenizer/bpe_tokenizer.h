// The Tokenizer implementation: added tokens split off first, then per section NFC, the Qwen2
// pre-tokenizer and byte-level BPE; decode joins token bytes and replaces invalid UTF-8.
// Built by load_bpe_tokenizer (tokenizer_load.cpp) from tokenizer.json + tokenizer_config.json.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"

namespace megadecode {

struct AddedTokenSpec {
  int32_t id;
  std::string content;
  bool special;
};

struct BpeTokenizerSpec {
  std::unique_ptr<BpeModel> model;
  std::vector<AddedTokenSpec> added_tokens;
  std::vector<std::string> extra_special;  // tokenizer_config additional_special_tokens
  bool nfc = false;                        // normalizer: NFC or none
  std::optional<std::string> eos_token;
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeTokenizerSpec spec);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  int vocab_size() const override { return static_cast<int>(kinds_.size()); }
  std::optional<int32_t> token_id(std::string_view token) const override;
  bool is_special(int32_t id) const override { return kind(id) == Kind::kSpecial; }
  bool is_added_token(int32_t id) const override { return kind(id) != Kind::kBpe; }
  std::string token_bytes(int32_t id) const override { return std::string(bytes_of(id)); }
  std::optional<int32_t> eos_token_id() const override { return eos_id_; }

 private:
  enum class Kind : uint8_t { kUnused, kBpe, kAdded, kSpecial };
  Kind kind(int32_t id) const;  // Error if id is outside [0, vocab_size)
  const std::string& bytes_of(int32_t id) const;
  // Length of the longest added token at text[i], 0 if none.
  size_t added_token_at(std::string_view text, size_t i, int32_t* id) const;
  void encode_section(std::string_view section, std::vector<int32_t>& ids) const;

  std::unique_ptr<BpeModel> model_;
  std::vector<Kind> kinds_;                 // [vocab_size]
  std::vector<std::string> added_content_;  // [vocab_size] text of added tokens, empty otherwise
  // Added tokens by first byte, longest first: (content, id).
  std::array<std::vector<std::pair<std::string, int32_t>>, 256> added_by_first_byte_;
  bool nfc_;
  std::optional<int32_t> eos_id_;
};

}  // namespace megadecode
