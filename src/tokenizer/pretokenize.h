// The Qwen2/Qwen3 pre-tokenizer: splits normalized text into the pieces that BPE encodes
// separately, matching the Split regex of tokenizer.json (as the JavaScript reference runs it)
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// with a hand-written matcher over Unicode classes (no regex engine). "Isolated" behavior: the
// matches are the pieces, and the pattern matches every character, so nothing lies between.
#pragma once

#include <string_view>
#include <vector>

namespace megadecode {

// Appends the pieces of text (valid UTF-8), in order; they concatenate to text.
void pretokenize(std::string_view text, std::vector<std::string_view>& pieces);

}  // namespace megadecode
