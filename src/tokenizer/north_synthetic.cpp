// Synthetic North Mini Code tokenizer.json files (see north_synthetic.h).
#include "tokenizer/north_synthetic.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_set>

#include "core/check.h"
#include "core/rng.h"
#include "tokenizer/bpe.h"
#include "tokenizer/sample_text.h"
#include "tokenizer/split_patterns.h"

namespace megadecode {

using nlohmann::json;

const std::vector<NorthAddedToken>& north_low_tokens() {
  static const std::vector<NorthAddedToken> tokens = {
      {"<PAD>", true, false, false, false, false},       {"<UNK>", true, false, false, false, false},
      {"<CLS>", true, false, false, false, false},       {"<SEP>", true, false, false, false, false},
      {"<MASK_TOKEN>", true, false, false, false, false}, {"<BOS_TOKEN>", true, false, false, false, false},
      {"<EOS_TOKEN>", true, false, false, false, false}, {"<EOP_TOKEN>", true, false, false, false, false}};
  return tokens;
}

const std::vector<NorthAddedToken>& north_turn_tokens() {
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
  };
  return tokens;
}

std::string byte_level_name(const std::string& bytes) {
  std::string name;
  for (const char b : bytes) name += byte_level_char(static_cast<uint8_t>(b));
  return name;
}

json north_pre_tokenizer() {
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

namespace {

// The added tokens with their ids: the low ones, then the turn tokens and the extra ones.
std::vector<std::pair<int, NorthAddedToken>> added_tokens(const std::vector<NorthAddedToken>& extra) {
  std::vector<std::pair<int, NorthAddedToken>> out;
  for (size_t k = 0; k < north_low_tokens().size(); ++k) out.emplace_back(static_cast<int>(k), north_low_tokens()[k]);
  int id = kNorthFirstTurnToken;
  for (const NorthAddedToken& t : north_turn_tokens()) out.emplace_back(id++, t);
  for (const NorthAddedToken& t : extra) out.emplace_back(id++, t);
  return out;
}

// The vocabulary (token bytes by id) and merges: the BPE part grows from substrings of generated
// text whose two halves are tokens already, topped up with random pairs of tokens.
void north_vocab(uint64_t seed, int vocab_size, const std::vector<std::pair<int, NorthAddedToken>>& added,
                 std::vector<std::string>& tokens, std::vector<std::pair<std::string, std::string>>& merges) {
  tokens.assign(static_cast<size_t>(vocab_size), std::string());
  std::unordered_set<std::string> taken;
  for (const auto& [id, t] : added) {
    tokens[static_cast<size_t>(id)] = t.content;
    taken.insert(t.content);
  }
  int next = 0;
  auto next_free = [&] {
    while (next < vocab_size && !tokens[static_cast<size_t>(next)].empty()) ++next;
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
    if (taken.count(merged) != 0 || next_free() >= vocab_size) return;
    tokens[static_cast<size_t>(next)] = merged;
    taken.insert(merged);
    bpe_tokens.push_back(merged);
    merges.emplace_back(left, right);
  };
  const int n_bpe = vocab_size - 256 - static_cast<int>(added.size());
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

// {"vocab", "merges"} in tokenizer.json form, built once per (seed, vocab_size, added tokens).
const json& north_model_json(uint64_t seed, int vocab_size, const std::vector<std::pair<int, NorthAddedToken>>& added) {
  static std::mutex mutex;
  static std::map<std::tuple<uint64_t, int, std::string>, json> cache;
  std::string key;
  for (const auto& [id, t] : added) key += t.content + std::string(1, '\0');
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find({seed, vocab_size, key});
  if (it != cache.end()) return it->second;
  std::vector<std::string> tokens;
  std::vector<std::pair<std::string, std::string>> merges;
  north_vocab(seed, vocab_size, added, tokens, merges);
  json vocab = json::object();
  for (size_t id = 0; id < tokens.size(); ++id) vocab[byte_level_name(tokens[id])] = id;
  json merges_json = json::array();
  for (const auto& [l, r] : merges) merges_json.push_back(json::array({byte_level_name(l), byte_level_name(r)}));
  return cache[{seed, vocab_size, key}] = json{{"vocab", std::move(vocab)}, {"merges", std::move(merges_json)}};
}

// A <BOS_TOKEN> before the text, as encode adds it for completions (not for chat prompts, whose
// template writes it).
json north_post_processor() {
  const json bos = {{"SpecialToken", {{"id", "<BOS_TOKEN>"}, {"type_id", 0}}}};
  return {{"type", "TemplateProcessing"},
          {"single", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"pair", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
          {"special_tokens",
           {{"<BOS_TOKEN>", {{"id", "<BOS_TOKEN>"}, {"ids", {kNorthBosToken}}, {"tokens", {"<BOS_TOKEN>"}}}}}}};
}

}  // namespace

json north_tokenizer_json(uint64_t seed, int vocab_size, const json& pre_tokenizer,
                          const std::vector<NorthAddedToken>& extra_tokens) {
  const auto added = added_tokens(extra_tokens);
  const int n_needed = std::max(added.back().first + 1, static_cast<int>(added.size()) + 256 + 1);
  MD_REQUIRE(vocab_size >= n_needed, "a North tokenizer needs at least ", n_needed,
             " tokens (its special tokens start at ", kNorthFirstTurnToken, "), got vocab_size ", vocab_size);
  json added_json = json::array();
  for (const auto& [id, t] : added) {
    added_json.push_back({{"id", id}, {"content", t.content}, {"single_word", t.single_word}, {"lstrip", t.lstrip},
                          {"rstrip", t.rstrip}, {"normalized", t.normalized}, {"special", t.special}});
  }
  const json& model = north_model_json(seed, vocab_size, added);
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added_json},
          {"normalizer", {{"type", "NFC"}}},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor", north_post_processor()},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
            {"vocab", model["vocab"]}, {"merges", model["merges"]}}}};
}

json north_tokenizer_config_json(const std::string& chat_template) {
  json config = {{"tokenizer_class", "CohereTokenizer"},
                 {"bos_token", "<BOS_TOKEN>"},
                 {"eos_token", "<|END_OF_TURN_TOKEN|>"},
                 {"clean_up_tokenization_spaces", false}};
  if (!chat_template.empty()) config["chat_template"] = chat_template;
  return config;
}

}  // namespace megadecode
