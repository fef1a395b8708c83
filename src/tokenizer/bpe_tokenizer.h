// The Tokenizer implementation: added tokens split off first (those matched in raw text, then per
// section NFC and those matched in normalized text), then the pre-tokenizer stages and byte-level
// BPE; decode joins token bytes and replaces invalid UTF-8.
// Built by load_bpe_tokenizer (tokenizer_load.cpp) from tokenizer.json + tokenizer_config.json.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"

namespace megadecode {

struct BpeTokenizerSpec {
  std::unique_ptr<BpeModel> model;
  std::vector<AddedTokenSpec> added_tokens;
  std::vector<std::string> extra_special;  // tokenizer_config additional_special_tokens
  bool nfc = false;                        // normalizer: NFC or none
  PreTokenizer pre_tokenizer;
  // post_processor TemplateProcessing ("single"): the ids before and after the text, added when
  // encode is asked to add special tokens (e.g. North's <BOS_TOKEN>).
  std::vector<int32_t> prefix_ids, suffix_ids;
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
  // A run of raw text between added tokens: NFC, the added tokens of normalized text, then BPE.
  void encode_section(std::string_view section, std::vector<int32_t>& ids, std::deque<std::string>& arena) const;
  void encode_pieces(std::string_view normalized, std::vector<int32_t>& ids, std::deque<std::string>& arena) const;

  std::unique_ptr<BpeModel> model_;
  std::vector<Kind> kinds_;                 // [vocab_size]
  std::vector<std::string> added_content_;  // [vocab_size] text of added tokens, empty otherwise
  AddedTokenMatcher raw_added_;         // added tokens with normalized: false
  AddedTokenMatcher normalized_added_;  // added tokens with normalized: true
  bool nfc_;
  PreTokenizer pre_tokenizer_;
  std::vector<int32_t> prefix_ids_, suffix_ids_;
  std::optional<int32_t> eos_id_;
};

}  // namespace megadecode
