// The byte trie: text tokens sorted by their bytes, then laid out in preorder from the sorted
// list (a node per distinct prefix).
#include "structured/vocab.h"

#include <algorithm>
#include <numeric>

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

}  // namespace megadecode::structured
