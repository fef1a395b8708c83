// The vocabulary as the grammar engine sees it: each token's bytes, which tokens are plain text
// (special and added tokens never match a grammar), the end tokens, and a byte trie over the
// text tokens laid out in preorder so that a walk skips a dead subtree in one step.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace megadecode {
class Tokenizer;
}

namespace megadecode::structured {

struct TrieNode {
  int32_t subtree_end;  // one past the last node of this node's subtree (preorder)
  int32_t tok_begin;    // tokens whose bytes end here: tokens()[tok_begin, tok_end)
  int32_t tok_end;
  uint16_t depth;       // bytes from the root
  uint8_t byte;         // the byte that leads here from the parent
};

// The text tokens seen from inside a JSON string, by the number of characters they use (a
// character split by the token's end counts): what a string's body allows at any count, without
// a trie walk. Built once per vocabulary; the string language is json_grammar.cpp's string_char().
struct StringTable {
  std::vector<std::vector<uint32_t>> inside_upto;   // [c]: masks of tokens inside the string using <= c characters
  std::vector<std::vector<uint32_t>> closing_upto;  // [c]: tokens of 1..c characters and the closing quote, ending there
  std::vector<std::vector<int32_t>> exits;          // [c]: trie nodes just past the closing quote after c >= 1
                                                    //      characters, with children
};

class Vocabulary {
 public:
  // token_bytes[id]: the token's bytes; is_text[id]: false for special and added tokens (never
  // allowed by a grammar; an end token is allowed only where the grammar accepts).
  Vocabulary(std::vector<std::string> token_bytes, std::vector<bool> is_text, std::vector<int32_t> end_ids);
  // From a loaded tokenizer: added tokens are not text.
  static Vocabulary from_tokenizer(const Tokenizer& tokenizer, std::vector<int32_t> end_ids);

  int size() const { return static_cast<int>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }
  bool is_text(int32_t id) const { return is_text_[id]; }
  bool is_end(int32_t id) const;
  std::span<const int32_t> end_ids() const { return end_ids_; }

  // Node 0 is the root (no byte); node i's children are the nodes of its subtree at depth + 1.
  std::span<const TrieNode> trie() const { return trie_; }
  std::span<const int32_t> trie_tokens() const { return trie_tokens_; }
  int max_depth() const { return max_depth_; }
  const StringTable& strings() const { return strings_; }

 private:
  void build_trie();
  void build_string_table();

  std::vector<std::string> bytes_;
  std::vector<bool> is_text_;
  std::vector<int32_t> end_ids_;
  std::vector<TrieNode> trie_;
  std::vector<int32_t> trie_tokens_;  // token ids grouped by trie node
  int max_depth_ = 0;
  StringTable strings_;
};

}  // namespace megadecode::structured
