// The pre-tokenizer of tokenizer.json: a sequence of stages that split normalized text into the
// pieces BPE encodes separately. Stages: Split (a pattern of split_patterns.h or a literal string,
// each delimiter behaviour, invert), Digits and ByteLevel (add_prefix_space, use_regex), with the
// semantics of HF tokenizers (pre_tokenizers/split.rs, digits.rs, byte_level.rs). ByteLevel's byte
// to character mapping needs no work here: the BPE model holds tokens as raw bytes.
#pragma once

#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/split_patterns.h"

namespace megadecode {

// What a Split does with the delimiters (the matches) it finds, as HF tokenizers defines it.
enum class SplitBehavior : unsigned char { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStage {
  enum class Type : unsigned char { kSplit, kDigits, kByteLevel };
  Type type = Type::kSplit;
  // kSplit: a regex pattern, or the literal `literal` when it is non-empty.
  SplitPattern pattern = SplitPattern::kQwen2;
  std::string literal;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;  // the matches are the non-delimiters
  // kDigits: each \p{N} character alone, else runs of them (Rust's char::is_numeric).
  bool individual_digits = false;
  // kByteLevel: prefix a space to a piece that does not start with one; split with the GPT-2 regex.
  bool add_prefix_space = false;
  bool use_regex = true;
};

class PreTokenizer {
 public:
  PreTokenizer() = default;
  explicit PreTokenizer(std::vector<PreTokenizerStage> stages) : stages_(std::move(stages)) {}

  // Appends the pieces of text (valid UTF-8), in order. Pieces view text, or strings of *arena
  // (a piece given a prefix space); without add_prefix_space they concatenate to text.
  void run(std::string_view text, std::vector<std::string_view>& pieces, std::deque<std::string>& arena) const;

  const std::vector<PreTokenizerStage>& stages() const { return stages_; }

 private:
  std::vector<PreTokenizerStage> stages_;
};

// Splits one piece by a delimiter behaviour: `spans` are [start, end) byte ranges covering the
// piece in order, each flagged as a match (a delimiter, after invert); appends the kept pieces.
struct SplitSpan {
  size_t start, end;
  bool match;
};
void split_by_behavior(std::string_view piece, const std::vector<SplitSpan>& spans, SplitBehavior behavior,
                       std::vector<std::string_view>& out);

// The Qwen2/Qwen3 pre-tokenizer: SplitPattern::kQwen2, Isolated. Pieces concatenate to text.
void pretokenize(std::string_view text, std::vector<std::string_view>& pieces);

}  // namespace megadecode
