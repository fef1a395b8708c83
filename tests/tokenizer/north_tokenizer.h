// North Mini Code tokenizers for the tokenizer tests: the synthetic tokenizer.json of
// tokenizer/north_synthetic.h (262,144 tokens, North's special tokens and pipeline, or a
// pre-tokenizer the caller chooses) with tokens for each added-token flag after the cmd4 ones.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "tokenizer/north_synthetic.h"
#include "tokenizer/split_patterns.h"

namespace megadecode::testing {

using megadecode::kNorthFirstTurnToken;
using megadecode::kNorthVocabSize;
using megadecode::north_low_tokens;
using megadecode::north_pre_tokenizer;
using megadecode::NorthAddedToken;

// Added tokens with each flag, after North's turn tokens. The reference implements these flags
// too (it ignores single_word and normalized, so the normalized token is one NFC cannot change or
// join to its neighbours).
inline const std::vector<NorthAddedToken>& north_flag_tokens() {
  static const std::vector<NorthAddedToken> tokens = {
      {"<|LSTRIP|>", true, false, true, false, false},
      {"<|RSTRIP|>", true, false, false, true, false},
      {"<|BOTH_STRIP|>", false, false, true, true, false},
      {"[TOOL]", false, false, false, false, true},
      {"<co>", false, false, false, false, false},
      {"<co", false, false, false, false, false},  // a prefix of another token: the longest wins
  };
  return tokens;
}

// The turn tokens and the flag tokens, in id order from kNorthFirstTurnToken.
inline const std::vector<NorthAddedToken>& north_turn_tokens() {
  static const std::vector<NorthAddedToken> tokens = [] {
    std::vector<NorthAddedToken> all = megadecode::north_turn_tokens();
    all.insert(all.end(), north_flag_tokens().begin(), north_flag_tokens().end());
    return all;
  }();
  return tokens;
}

// The GPT-4o-style pattern as tiktoken's o200k spells its contractions: (?i:'s|...|'d).
inline std::string o200k_spelling() {
  std::string regex(split_pattern_regex(SplitPattern::kGpt4o));
  const std::string expanded = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
  for (size_t at; (at = regex.find(expanded)) != std::string::npos;) {
    regex.replace(at, expanded.size(), "(?i:'s|'t|'re|'ve|'m|'ll|'d)");
  }
  return regex;
}

inline nlohmann::json north_tokenizer_json(uint64_t seed, const nlohmann::json& pre_tokenizer) {
  return megadecode::north_tokenizer_json(seed, kNorthVocabSize, pre_tokenizer, north_flag_tokens());
}

// Writes tokenizer.json and North's tokenizer_config.json to a fresh temporary directory named
// after `name`.
inline std::filesystem::path write_north_tokenizer(const std::string& name, const nlohmann::json& tokenizer) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("megadecode-north-" + name + "-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << tokenizer.dump();
  std::ofstream(dir / "tokenizer_config.json") << north_tokenizer_config_json().dump();
  return dir;
}

}  // namespace megadecode::testing
