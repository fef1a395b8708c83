// Encode/decode of the byte-level BPE tokenizer (see bpe_tokenizer.h).
#include "tokenizer/bpe_tokenizer.h"

#include <algorithm>

#include "core/check.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace megadecode {

BpeTokenizer::BpeTokenizer(BpeTokenizerSpec spec)
    : model_(std::move(spec.model)),
      nfc_(spec.nfc),
      pre_tokenizer_(std::move(spec.pre_tokenizer)),
      prefix_ids_(std::move(spec.prefix_ids)),
      suffix_ids_(std::move(spec.suffix_ids)) {
  int32_t n = model_->size();
  for (const AddedTokenSpec& t : spec.added_tokens) n = std::max(n, t.id + 1);
  kinds_.assign(static_cast<size_t>(n), Kind::kUnused);
  added_content_.resize(static_cast<size_t>(n));
  std::fill(kinds_.begin(), kinds_.begin() + model_->size(), Kind::kBpe);
  for (const AddedTokenSpec& t : spec.added_tokens) {
    MD_REQUIRE(!t.content.empty(), "tokenizer.json: added token ", t.id, " is empty");
    MD_REQUIRE(utf8::find_invalid(t.content) == std::string_view::npos, "tokenizer.json: added token ", t.id,
               " is not valid UTF-8");
    const bool special = t.special || std::find(spec.extra_special.begin(), spec.extra_special.end(), t.content) !=
                                          spec.extra_special.end();
    kinds_[static_cast<size_t>(t.id)] = special ? Kind::kSpecial : Kind::kAdded;
    added_content_[static_cast<size_t>(t.id)] = t.content;
    (t.normalized ? normalized_added_ : raw_added_).add(t);
  }
  for (const auto* list : {&prefix_ids_, &suffix_ids_}) {
    for (const int32_t id : *list) {
      MD_REQUIRE(id >= 0 && id < vocab_size() && kinds_[static_cast<size_t>(id)] != Kind::kUnused,
                 "tokenizer.json: the post_processor adds token id ", id, ", which is not a token");
    }
  }
  if (spec.eos_token) {
    eos_id_ = token_id(*spec.eos_token);
    MD_REQUIRE(eos_id_.has_value(), "tokenizer_config.json: eos_token \"", *spec.eos_token, "\" is not a token");
  }
}

BpeTokenizer::Kind BpeTokenizer::kind(int32_t id) const {
  MD_REQUIRE(id >= 0 && id < vocab_size(), "token id ", id, " is outside the vocabulary [0, ", vocab_size(), ")");
  const Kind k = kinds_[static_cast<size_t>(id)];
  MD_REQUIRE(k != Kind::kUnused, "token id ", id, " is not assigned to any token");
  return k;
}

const std::string& BpeTokenizer::bytes_of(int32_t id) const {
  return kind(id) == Kind::kBpe ? model_->token_bytes(id) : added_content_[static_cast<size_t>(id)];
}

std::optional<int32_t> BpeTokenizer::token_id(std::string_view token) const {
  if (auto id = raw_added_.find(token)) return id;
  if (auto id = normalized_added_.find(token)) return id;
  // Regular tokens are named in the ByteLevel alphabet ("Ġthe"), as in tokenizer.json.
  std::string bytes;
  if (!byte_level_decode(token, &bytes)) return std::nullopt;
  const int32_t id = model_->find(bytes);
  if (id < 0) return std::nullopt;
  return id;
}

void BpeTokenizer::encode_pieces(std::string_view normalized, std::vector<int32_t>& ids,
                                 std::deque<std::string>& arena) const {
  std::vector<std::string_view> pieces;
  pre_tokenizer_.run(normalized, pieces, arena);
  for (const std::string_view piece : pieces) model_->encode_piece(piece, ids);
}

void BpeTokenizer::encode_section(std::string_view section, std::vector<int32_t>& ids,
                                  std::deque<std::string>& arena) const {
  if (section.empty()) return;
  if (nfc_ && !unicode::is_nfc_quick(section)) {
    arena.push_back(unicode::nfc(section));
    section = arena.back();
  }
  if (normalized_added_.empty()) {
    encode_pieces(section, ids, arena);
    return;
  }
  std::vector<AddedSplit> parts;
  normalized_added_.split(section, parts);
  for (const AddedSplit& part : parts) {
    if (part.id >= 0) {
      ids.push_back(part.id);
    } else if (!part.text.empty()) {
      encode_pieces(part.text, ids, arena);
    }
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const size_t bad = utf8::find_invalid(text);
  MD_REQUIRE(bad == std::string_view::npos, "tokenizer: input text is not valid UTF-8 (byte 0x", std::hex,
             static_cast<int>(static_cast<uint8_t>(text[bad])), std::dec, " at offset ", bad, ")");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids = prefix_ids_;
  std::deque<std::string> arena;  // normalized sections and prefixed pieces the views point into
  if (raw_added_.empty()) {
    encode_section(text, ids, arena);
  } else {
    std::vector<AddedSplit> parts;
    raw_added_.split(text, parts);
    for (const AddedSplit& part : parts) {
      if (part.id >= 0) {
        ids.push_back(part.id);
      } else {
        encode_section(part.text, ids, arena);
      }
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
  return ids;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string out, bytes;  // bytes: the byte-level run since the last added token
  for (const int32_t id : ids) {
    const Kind k = kind(id);
    if (k == Kind::kBpe) {
      bytes += model_->token_bytes(id);
      continue;
    }
    if (k == Kind::kSpecial && skip_special_tokens) continue;
    utf8::append_lossy(out, bytes);
    bytes.clear();
    out += added_content_[static_cast<size_t>(id)];
  }
  utf8::append_lossy(out, bytes);
  return out;
}

}  // namespace megadecode
