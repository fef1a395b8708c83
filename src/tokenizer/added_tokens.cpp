// Finding added tokens in text, with their single_word / lstrip / rstrip flags (see added_tokens.h).
#include "tokenizer/added_tokens.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace megadecode {
namespace {

// The code point that ends text[0, end) (valid UTF-8, end > 0).
char32_t last_char(std::string_view text, size_t end, size_t* start) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<uint8_t>(text[i]) & 0xC0) == 0x80) --i;
  char32_t cp = 0;
  utf8::decode_one(text, i, &cp);
  *start = i;
  return cp;
}

bool is_word_char(char32_t cp) {
  return cp == '_' || (unicode::char_class(cp) & (unicode::kLetter | unicode::kNumber | unicode::kMark)) != 0;
}

bool is_space(char32_t cp) { return (unicode::char_class(cp) & unicode::kSpace) != 0; }

}  // namespace

void AddedTokenMatcher::add(const AddedTokenSpec& token) {
  MD_CHECK(!token.content.empty());
  auto& list = by_first_byte_[static_cast<uint8_t>(token.content[0])];
  // Longest first; among equal lengths, in the order added.
  const auto at = std::upper_bound(list.begin(), list.end(), token.content.size(),
                                   [](size_t size, const Entry& e) { return size > e.content.size(); });
  list.insert(at, Entry{token.content, token.id, token.single_word, token.lstrip, token.rstrip});
  ++n_tokens_;
}

std::optional<int32_t> AddedTokenMatcher::find(std::string_view content) const {
  if (content.empty()) return std::nullopt;
  for (const Entry& e : by_first_byte_[static_cast<uint8_t>(content[0])]) {
    if (e.content == content) return e.id;
  }
  return std::nullopt;
}

const AddedTokenMatcher::Entry* AddedTokenMatcher::longest_at(std::string_view text, size_t i) const {
  for (const Entry& e : by_first_byte_[static_cast<uint8_t>(text[i])]) {
    if (e.content.size() > text.size() - i || std::memcmp(text.data() + i, e.content.data(), e.content.size()) != 0) {
      continue;
    }
    // The longest match is the match, as in a leftmost-longest automaton: a single_word token
    // that fails its condition leaves no shorter token in its place.
    if (e.single_word) {
      size_t start;
      const size_t end = i + e.content.size();
      char32_t next = 0;
      if (i > 0 && is_word_char(last_char(text, i, &start))) return nullptr;
      if (end < text.size() && utf8::decode_one(text, end, &next) != 0 && is_word_char(next)) return nullptr;
    }
    return &e;
  }
  return nullptr;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<AddedSplit>& out) const {
  size_t run_start = 0;  // start of the current run of text
  for (size_t i = 0; i < text.size();) {
    const auto& candidates = by_first_byte_[static_cast<uint8_t>(text[i])];
    const Entry* e = candidates.empty() ? nullptr : longest_at(text, i);
    if (e == nullptr) {
      // A longest match that single_word refused is skipped whole, as the automaton moves past it.
      size_t skip = 1;
      for (const Entry& c : candidates) {
        if (c.content.size() <= text.size() - i && std::memcmp(text.data() + i, c.content.data(), c.content.size()) == 0) {
          skip = c.content.size();
          break;
        }
      }
      i += skip;
      continue;
    }
    size_t run_end = i, stop = i + e->content.size();
    if (e->lstrip) {
      size_t start;
      while (run_end > run_start && is_space(last_char(text, run_end, &start))) run_end = start;
    }
    if (e->rstrip) {
      char32_t cp;
      size_t n;
      while (stop < text.size() && (n = utf8::decode_one(text, stop, &cp)) != 0 && is_space(cp)) stop += n;
    }
    out.push_back(AddedSplit{text.substr(run_start, run_end - run_start), -1});
    out.push_back(AddedSplit{{}, e->id});
    i = run_start = stop;
  }
  out.push_back(AddedSplit{text.substr(run_start), -1});
}

}  // namespace megadecode
