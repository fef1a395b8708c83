// Synthetic tokenizer.json files with North Mini Code's layout for the tokenizer tests: a
// 262,144-token byte-level BPE vocabulary (special tokens at 0..7 and from 255000, the 256 bytes,
// and merges grown from generated text), the special tokens of the cmd4 chat format plus tokens
// with each added-token flag, a TemplateProcessing post-processor adding <BOS_TOKEN>, and a
// pre-tokenizer the caller chooses (north_pre_tokenizer() is
// North's: the digit-group Split, the GPT-4o-style Split, ByteLevel without its regex).
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/rng.h"
#include "tokenizer/bpe.h"
#include "bench/sample_text.h"
#include "tokenizer/split_patterns.h"

namespace megadecode::testing {

inline constexpr int kNorthVocabSize = 262144;
inline constexpr int kNorthFirstTurnToken = 255000;

struct NorthAddedToken {
  const char* content;
  bool special, single_word, lstrip, rstrip, normalized;
};

// Ids 0..7, then from kNorthFirstTurnToken; EOS <|END_OF_TURN_TOKEN|> is 255001 as in North.
inline const std::vector<NorthAddedToken>& north_low_tokens() {
  static const std::vector<NorthAddedToken> tokens = {
      {"<PAD>", true, false, false, false, false},       {"<UNK>", true, false, false, false, false},
      {"<CLS>", true, false, false, false, false},       {"<SEP>", true, false, false, false, false},
      {"<MASK_TOKEN>", true, false, false, false, false}, {"<BOS_TOKEN>", true, false, false, false, false},
      {"<EOS_TOKEN>", true, false, false, false, false}, {"<EOP_TOKEN>", true, false, false, false, false}};
  return tokens;
}
inline const std::vector<NorthAddedToken>& north_turn_tokens() {
  static const std::vector<NorthAddedToken> tokens = {
      {"<|START_OF_TURN_TOKEN|>", true, false, false, false, false},
      {"<|END_OF_TURN_TOKEN|>", true, false, false, false, false},
      {"<|USER_TOKEN|>", true, false, false, false, false},
      {"<|CHATBOT_TOKEN|>", true, false, false, false, false},
      {"<|SYSTEM_TOKEN|>", true, false, false, false, false},
      {"<|START_THINKING|>", true, false, false, false, false},
      {"<|END_THINKING|>", true, false, false, false, false},
      {"<|START_RESPONSE|>", true, false, false, false, false},
      {"<|END_RESPONSE|>", true, false, false, false, false},
      {"<|START_TEXT|>", true, false, false, false, false},
      {"<|END_TEXT|>", true, false, false, false, false},
      {"<|START_ACTION|>", true, false, false, false, false},
      {"<|END_ACTION|>", true, false, false, false, false},
      {"<|START_TOOL_RESULT|>", true, false, false, false, false},
      {"<|END_TOOL_RESULT|>", true, false, false, false, false},
      // Flags the reference implements too (it ignores single_word and normalized, so the
      // normalized token is one NFC cannot change or join to its neighbours).
      {"<|LSTRIP|>", true, false, true, false, false},
      {"<|RSTRIP|>", true, false, false, true, false},
      {"<|BOTH_STRIP|>", false, false, true, true, false},
      {"[TOOL]", false, false, false, false, true},
      {"<co>", false, false, false, false, false},
      {"<co", false, false, false, false, false},  // a prefix of another token: the longest wins
  };
  return tokens;
}

inline std::string byte_level_name(const std::string& bytes) {
  std::string name;
  for (const char b : bytes) name += byte_level_char(static_cast<uint8_t>(b));
  return name;
}

// The GPT-4o-style pattern as tiktoken's o200k spells its contractions: (?i:'s|...|'d)?.
inline std::string o200k_spelling() {
  std::string regex(split_pattern_regex(SplitPattern::kGpt4o));
  const std::string expanded = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
  for (size_t at; (at = regex.find(expanded)) != std::string::npos;) {
    regex.replace(at, expanded.size(), "(?i:'s|'t|'re|'ve|'m|'ll|'d)");
  }
  return regex;
}

// North's pre_tokenizer.
inline nlohmann::json north_pre_tokenizer() {
  using nlohmann::json;
  auto split = [](SplitPattern p) {
    return json{{"type", "Split"},
                {"pattern", {{"Regex", std::string(split_pattern_regex(p))}}},
                {"behavior", "Isolated"},
                {"invert", false}};
  };
  return {{"type", "Sequence"},
          {"pretokenizers",
           {split(SplitPattern::kDigitGroups), split(SplitPattern::kGpt4o),
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
}

// The vocabulary (token bytes by id) and merges: the BPE part grows from substrings of generated
// text whose two halves are tokens already, topped up with random pairs of tokens.
inline void north_vocab(uint64_t seed, std::vector<std::string>& tokens,
                        std::vector<std::pair<std::string, std::string>>& merges) {
  tokens.assign(kNorthVocabSize, std::string());
  std::unordered_set<std::string> taken;
  for (size_t k = 0; k < north_low_tokens().size(); ++k) tokens[k] = north_low_tokens()[k].content;
  for (size_t k = 0; k < north_turn_tokens().size(); ++k) {
    tokens[kNorthFirstTurnToken + k] = north_turn_tokens()[k].content;
  }
  for (const std::string& t : tokens) {
    if (!t.empty()) taken.insert(t);
  }
  int next = static_cast<int>(north_low_tokens().size());
  auto next_free = [&] {
    while (next < kNorthVocabSize && !tokens[static_cast<size_t>(next)].empty()) ++next;
    return next;
  };
  for (int b = 0; b < 256; ++b) {
    const std::string byte(1, static_cast<char>(b));
    tokens[static_cast<size_t>(next_free())] = byte;
    taken.insert(byte);
  }
  SplitMix64 rng(seed);
  const std::string text = sample_text::mixed_text(seed, 3 << 20);
  std::vector<std::string> bpe_tokens;  // for the random top-up
  auto add = [&](const std::string& left, const std::string& right) {
    const std::string merged = left + right;
    if (taken.count(merged) != 0 || next_free() >= kNorthVocabSize) return;
    tokens[static_cast<size_t>(next)] = merged;
    taken.insert(merged);
    bpe_tokens.push_back(merged);
    merges.emplace_back(left, right);
  };
  const int n_bpe = kNorthVocabSize - 256 - static_cast<int>(north_low_tokens().size() + north_turn_tokens().size());
  for (int attempt = 0; attempt < 8 * n_bpe && static_cast<int>(merges.size()) < n_bpe; ++attempt) {
    const size_t len = 2 + rng.below(rng.below(4) == 0 ? 14 : 5);
    const size_t pos = rng.below(text.size() - len);
    const std::string s = text.substr(pos, len);
    if (s.find(' ', 1) != std::string::npos || taken.count(s) != 0) continue;
    const size_t first_split = 1 + rng.below(len - 1);
    for (size_t k = 0; k < len - 1; ++k) {
      const size_t cut = 1 + (first_split - 1 + k) % (len - 1);
      if (taken.count(s.substr(0, cut)) != 0 && taken.count(s.substr(cut)) != 0) {
        add(s.substr(0, cut), s.substr(cut));
        break;
      }
    }
  }
  while (static_cast<int>(merges.size()) < n_bpe) {
    const std::string& left = bpe_tokens[rng.below(bpe_tokens.size())];
    const std::string right(1, static_cast<char>(rng.below(256)));
    if (left.size() < 24) add(left, right);
  }
}

// A <BOS_TOKEN> before the text, as encode adds it for completions (not for chat prompts, whose
// template writes it).
inline nlohmann::json north_post_processor() {
  using nlohmann::json;
  const json bos = {{"SpecialToken", {{"id", "<BOS_TOKEN>"}, {"type_id", 0}}}};
  return {{"type", "TemplateProcessing"},
          {"single", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"pair", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
          {"special_tokens", {{"<BOS_TOKEN>", {{"id", "<BOS_TOKEN>"}, {"ids", {5}}, {"tokens", {"<BOS_TOKEN>"}}}}}}};
}

// The model of north_tokenizer_json: {"vocab", "merges"} in tokenizer.json form, built once per seed.
inline const nlohmann::json& north_model_json(uint64_t seed) {
  using nlohmann::json;
  static std::map<uint64_t, json> cache;
  auto it = cache.find(seed);
  if (it != cache.end()) return it->second;
  std::vector<std::string> tokens;
  std::vector<std::pair<std::string, std::string>> merges;
  north_vocab(seed, tokens, merges);
  json vocab = json::object();
  for (size_t id = 0; id < tokens.size(); ++id) vocab[byte_level_name(tokens[id])] = id;
  json merges_json = json::array();
  for (const auto& [l, r] : merges) merges_json.push_back(json::array({byte_level_name(l), byte_level_name(r)}));
  return cache[seed] = json{{"vocab", std::move(vocab)}, {"merges", std::move(merges_json)}};
}

inline nlohmann::json north_tokenizer_json(uint64_t seed, const nlohmann::json& pre_tokenizer) {
  using nlohmann::json;
  json added = json::array();
  auto add_tokens = [&](const std::vector<NorthAddedToken>& list, int first_id) {
    for (size_t k = 0; k < list.size(); ++k) {
      const NorthAddedToken& t = list[k];
      added.push_back({{"id", first_id + static_cast<int>(k)}, {"content", t.content}, {"single_word", t.single_word},
                       {"lstrip", t.lstrip}, {"rstrip", t.rstrip}, {"normalized", t.normalized}, {"special", t.special}});
    }
  };
  add_tokens(north_low_tokens(), 0);
  add_tokens(north_turn_tokens(), kNorthFirstTurnToken);
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor", north_post_processor()},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
            {"vocab", north_model_json(seed)["vocab"]}, {"merges", north_model_json(seed)["merges"]}}}};
}

// Writes tokenizer.json (from north_tokenizer_json, or `tokenizer` when given) and
// tokenizer_config.json to a fresh temporary directory named after `name`.
inline std::filesystem::path write_north_tokenizer(const std::string& name, const nlohmann::json& tokenizer) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("megadecode-north-" + name + "-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << tokenizer.dump();
  std::ofstream(dir / "tokenizer_config.json") << nlohmann::json{{"tokenizer_class", "CohereTokenizer"},
                                                                 {"eos_token", "<|END_OF_TURN_TOKEN|>"},
                                                                 {"bos_token", "<BOS_TOKEN>"},
                                                                 {"clean_up_tokenization_spaces", false}}
                                                      .dump();
  return dir;
}

}  // namespace megadecode::testing
