// The added tokens of tokenizer.json ("added_tokens"): found in the text before the pipeline runs,
// longest first at the leftmost position, with the flags of HF tokenizers (added_vocabulary.rs):
//   single_word  matches only where no word character (\p{L}, \p{N}, \p{M} or _) touches it;
//   lstrip       also takes the whitespace before it; rstrip the whitespace after it;
//   normalized   matched in normalized text (after NFC), else in the raw text first.
// Whitespace is JavaScript's \s, as the reference trims it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace megadecode {

struct AddedTokenSpec {
  int32_t id;
  std::string content;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// One part of a text cut at added tokens: a run of text (id < 0) or an added token.
struct AddedSplit {
  std::string_view text;
  int32_t id = -1;
};

// The added tokens of one kind (normalized or not) and the search for them.
class AddedTokenMatcher {
 public:
  void add(const AddedTokenSpec& token);  // content must be non-empty

  bool empty() const { return n_tokens_ == 0; }
  std::optional<int32_t> find(std::string_view content) const;

  // Cuts text into runs and tokens, in order; the runs exclude whitespace that lstrip/rstrip took.
  // Runs may be empty; the parts view text.
  void split(std::string_view text, std::vector<AddedSplit>& out) const;

 private:
  struct Entry {
    std::string content;
    int32_t id;
    bool single_word, lstrip, rstrip;
  };
  // The longest entry at text[i] whose single_word condition holds there, or nullptr.
  const Entry* longest_at(std::string_view text, size_t i) const;

  std::array<std::vector<Entry>, 256> by_first_byte_;  // longest first
  size_t n_tokens_ = 0;
};

}  // namespace megadecode
