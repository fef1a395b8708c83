// The regular expressions of tokenizer.json Split pre-tokenizers (and ByteLevel's own regex) that
// the tokenizer implements, each as a hand-written matcher over Unicode classes (no regex engine)
// that finds what a backtracking engine finds, with JavaScript's semantics as the reference
// tokenizer runs them: \s is JavaScript's, \d and \b are ASCII. A pattern is recognised by its
// exact text; any other pattern is refused when the tokenizer loads.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

namespace megadecode {

enum class SplitPattern : unsigned char {
  // Qwen2/Qwen3:
  //   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
  //   \s*[\r\n]+|\s+(?!\S)|\s+
  kQwen2,
  // GPT-2, the regex of ByteLevel with use_regex:
  //   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // North's first split (llama.cpp TINY_AYA): ASCII digits in groups of three from the right,
  // only in a digit run followed by a non-word character or the end:  \d{1,3}(?=(?:\d{3})*\b)
  kDigitGroups,
  // GPT-4o style, North's second split (llama.cpp TINY_AYA), with A = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}],
  // B = [\p{Ll}\p{Lm}\p{Lo}\p{M}], C = (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?:
  //   [^\r\n\p{L}\p{N}]?A*B+C|[^\r\n\p{L}\p{N}]?A+B*C|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|
  //   \s*[\r\n]+|\s+(?!\S)|\s+
  // also recognised as tiktoken's o200k writes it, with C = (?i:'s|'t|'re|'ve|'m|'ll|'d)?
  kGpt4o,
};

// The pattern whose tokenizer.json "Regex" text is `regex`, if it is one of the above.
std::optional<SplitPattern> split_pattern_from_regex(std::string_view regex);
// The tokenizer.json text of a pattern.
std::string_view split_pattern_regex(SplitPattern pattern);

// Length in bytes of the leftmost match at or after `from` in text (valid UTF-8), its start in
// *start; 0 when there is none. No pattern above matches the empty string.
size_t split_pattern_find(SplitPattern pattern, std::string_view text, size_t from, size_t* start);

// Appends the matches of pattern in text and the gaps between them, in order (a Split with the
// Isolated behaviour): the pieces concatenate to text.
void split_pattern_pieces(SplitPattern pattern, std::string_view text, std::vector<std::string_view>& pieces);

}  // namespace megadecode
