// The byte trie: text tokens sorted by their bytes, then laid out in preorder from the sorted
// list (a node per distinct prefix).
#include "structured/vocab.h"

#include <algorithm>
#include <numeric>
#include <string_view>

#include "core/check.h"
#include "tokenizer/tokenizer.h"

namespace megadecode::structured {

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, std::vector<bool> is_text, std::vector<int32_t> end_ids)
    : bytes_(std::move(token_bytes)), is_text_(std::move(is_text)), end_ids_(std::move(end_ids)) {
  MD_REQUIRE(bytes_.size() == is_text_.size(), "vocabulary: ", bytes_.size(), " token strings but ", is_text_.size(),
             " text flags");
  MD_REQUIRE(!end_ids_.empty(), "vocabulary: no end token");
  for (const int32_t id : end_ids_) {
    MD_REQUIRE(id >= 0 && id < size(), "vocabulary: end token ", id, " is outside the vocabulary of ", size());
    is_text_[id] = false;
  }
  build_trie();
  build_string_table();
}

Vocabulary Vocabulary::from_tokenizer(const Tokenizer& tokenizer, std::vector<int32_t> end_ids) {
  const int n = tokenizer.vocab_size();
  std::vector<std::string> bytes(n);
  std::vector<bool> is_text(n);
  for (int32_t id = 0; id < n; ++id) {
    bytes[id] = tokenizer.token_bytes(id);
    is_text[id] = !tokenizer.is_added_token(id) && !tokenizer.is_special(id);
  }
  return Vocabulary(std::move(bytes), std::move(is_text), std::move(end_ids));
}

bool Vocabulary::is_end(int32_t id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}

void Vocabulary::build_trie() {
  std::vector<int32_t> order;
  for (int32_t id = 0; id < size(); ++id)
    if (is_text_[id] && !bytes_[id].empty()) order.push_back(id);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
  trie_tokens_ = order;
  trie_.clear();
  trie_.push_back({0, 0, 0, 0, 0});
  // Sorted strings visit prefixes in preorder: open a node per new byte past the common prefix
  // with the path so far, closing (setting subtree_end of) the nodes left behind.
  std::vector<int32_t> path = {0};  // path[d]: the node at depth d on the current path
  std::string prev;
  for (size_t k = 0; k < order.size(); ++k) {
    const std::string& s = bytes_[order[k]];
    size_t common = 0;
    while (common < prev.size() && common < s.size() && prev[common] == s[common]) ++common;
    while (path.size() > common + 1) {
      trie_[path.back()].subtree_end = static_cast<int32_t>(trie_.size());
      path.pop_back();
    }
    for (size_t d = common; d < s.size(); ++d) {
      MD_REQUIRE(d + 1 < 65536, "vocabulary: token ", order[k], " is longer than 65535 bytes");
      trie_.push_back({0, 0, 0, static_cast<uint16_t>(d + 1), static_cast<uint8_t>(s[d])});
      path.push_back(static_cast<int32_t>(trie_.size() - 1));
    }
    TrieNode& at = trie_[path.back()];
    if (at.tok_end == at.tok_begin) at.tok_begin = at.tok_end = static_cast<int32_t>(k);
    at.tok_end = static_cast<int32_t>(k + 1);
    max_depth_ = std::max(max_depth_, static_cast<int>(s.size()));
    prev = s;
  }
  while (!path.empty()) {
    trie_[path.back()].subtree_end = static_cast<int32_t>(trie_.size());
    path.pop_back();
  }
}

namespace {

// The byte automaton of one string character (json_grammar.cpp's string_char(), state for state):
// kBody is between characters; every other state is inside one.
enum ScanState : int8_t { kScanDead = -1, kBody, kEsc, kU, kUd, kH3, kH2, kH1, kC1, kC2, kC3, kE0, kEd, kF0, kF4 };

bool is_hex(uint8_t b) { return (b >= '0' && b <= '9') || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'); }

int8_t scan(int8_t s, uint8_t b) {
  const bool cont = b >= 0x80 && b <= 0xBF;
  switch (s) {
    case kBody:
      if ((b >= 0x20 && b <= 0x21) || (b >= 0x23 && b <= 0x5B) || (b >= 0x5D && b <= 0x7F)) return kBody;
      if (b == '\\') return kEsc;
      if (b >= 0xC2 && b <= 0xDF) return kC1;
      if (b == 0xE0) return kE0;
      if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return kC2;
      if (b == 0xED) return kEd;
      if (b == 0xF0) return kF0;
      if (b >= 0xF1 && b <= 0xF3) return kC3;
      if (b == 0xF4) return kF4;
      return kScanDead;
    case kEsc:
      if (b == 'u') return kU;
      for (const char c : std::string_view("\"\\/bfnrt"))
        if (b == static_cast<uint8_t>(c)) return kBody;
      return kScanDead;
    case kU:
      if (b == 'd' || b == 'D') return kUd;
      return is_hex(b) ? kH3 : kScanDead;
    case kUd: return b >= '0' && b <= '7' ? kH2 : kScanDead;
    case kH3: return is_hex(b) ? kH2 : kScanDead;
    case kH2: return is_hex(b) ? kH1 : kScanDead;
    case kH1: return is_hex(b) ? kBody : kScanDead;
    case kC1: return cont ? kBody : kScanDead;
    case kC2: return cont ? kC1 : kScanDead;
    case kC3: return cont ? kC2 : kScanDead;
    case kE0: return b >= 0xA0 && b <= 0xBF ? kC1 : kScanDead;
    case kEd: return b >= 0x80 && b <= 0x9F ? kC1 : kScanDead;
    case kF0: return b >= 0x90 && b <= 0xBF ? kC2 : kScanDead;
    case kF4: return b >= 0x80 && b <= 0x8F ? kC2 : kScanDead;
    default: return kScanDead;
  }
}

// Prefix unions: masks[c] = union of by_count[1..c] (masks[0] empty).
std::vector<std::vector<uint32_t>> prefix_masks(const std::vector<std::vector<int32_t>>& by_count, size_t n_words) {
  std::vector<std::vector<uint32_t>> masks(by_count.size(), std::vector<uint32_t>(n_words, 0));
  for (size_t c = 1; c < by_count.size(); ++c) {
    masks[c] = masks[c - 1];
    for (const int32_t id : by_count[c]) masks[c][id >> 5] |= 1u << (id & 31);
  }
  return masks;
}

}  // namespace

// One walk of the trie from inside a string, counting characters per depth.
void Vocabulary::build_string_table() {
  std::vector<std::vector<int32_t>> inside(1), closing(1);
  strings_.exits.assign(1, {});
  std::vector<int8_t> state(static_cast<size_t>(max_depth_) + 1, kBody);
  std::vector<int32_t> chars(static_cast<size_t>(max_depth_) + 1, 0);
  auto at = [](std::vector<std::vector<int32_t>>& v, size_t c) -> std::vector<int32_t>& {
    if (v.size() <= c) v.resize(c + 1);
    return v[c];
  };
  for (int32_t i = 1; i < static_cast<int32_t>(trie_.size());) {
    const TrieNode& n = trie_[i];
    const int8_t ps = state[n.depth - 1];
    const int32_t pc = chars[n.depth - 1];
    if (ps == kBody && n.byte == '"') {  // the closing quote: the string ends here
      if (pc >= 1) {
        for (int32_t k = n.tok_begin; k < n.tok_end; ++k) at(closing, static_cast<size_t>(pc)).push_back(trie_tokens_[k]);
        if (n.subtree_end > i + 1) at(strings_.exits, static_cast<size_t>(pc)).push_back(i);
      }
      i = n.subtree_end;
      continue;
    }
    const int8_t s = scan(ps, n.byte);
    if (s == kScanDead) {
      i = n.subtree_end;
      continue;
    }
    state[n.depth] = s;
    chars[n.depth] = pc + (s == kBody ? 1 : 0);
    const size_t used = static_cast<size_t>(chars[n.depth] + (s == kBody ? 0 : 1));
    for (int32_t k = n.tok_begin; k < n.tok_end; ++k) at(inside, used).push_back(trie_tokens_[k]);
    ++i;
  }
  const size_t n_words = (static_cast<size_t>(size()) + 31) / 32;
  strings_.inside_upto = prefix_masks(inside, n_words);
  strings_.closing_upto = prefix_masks(closing, n_words);
}

}  // namespace megadecode::structured
