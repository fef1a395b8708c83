// Synthetic tokenizer.json files with North Mini Code's layout: a byte-level BPE vocabulary
// (special tokens at 0..7 and from 255000, the 256 bytes, merges grown from generated text), the
// special tokens of the cmd4 chat format, North's pipeline (NFC, the digit-group and GPT-4o-style
// Splits, ByteLevel without its regex) and a TemplateProcessing post-processor adding <BOS_TOKEN>.
// `make-model --preset north-*` writes one beside its weights; the tokenizer tests build variants
// of it (other pre-tokenizers, tokens with each added-token flag). The token ids are North's
// layout, not its real vocabulary: only the special tokens' ids match the model's files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace megadecode {

inline constexpr int kNorthVocabSize = 262144;
inline constexpr int kNorthFirstTurnToken = 255000;  // <|START_OF_TURN_TOKEN|>
inline constexpr int kNorthBosToken = 5;              // <BOS_TOKEN>
inline constexpr int kNorthEosToken = 255001;         // <|END_OF_TURN_TOKEN|>

struct NorthAddedToken {
  const char* content;
  bool special, single_word, lstrip, rstrip, normalized;
};

// Ids 0..7: <PAD> ... <BOS_TOKEN> (5) ... <EOP_TOKEN>.
const std::vector<NorthAddedToken>& north_low_tokens();
// From kNorthFirstTurnToken: the turn and cmd4 markers, <|END_OF_TURN_TOKEN|> (EOS) second.
const std::vector<NorthAddedToken>& north_turn_tokens();

// A byte string in ByteLevel's alphabet (the form of vocab and merges entries).
std::string byte_level_name(const std::string& bytes);

// North's pre_tokenizer: Sequence[Split(digit groups), Split(GPT-4o-style), ByteLevel].
nlohmann::json north_pre_tokenizer();

// The tokenizer.json: vocab_size tokens (at least kNorthFirstTurnToken + the turn tokens and the
// extra ones), the added tokens, then `extra_tokens` as added tokens right after the turn tokens.
// Deterministic in seed; the vocabulary is built once per (seed, vocab_size, extra tokens).
nlohmann::json north_tokenizer_json(uint64_t seed, int vocab_size, const nlohmann::json& pre_tokenizer,
                                    const std::vector<NorthAddedToken>& extra_tokens = {});

// tokenizer_config.json as North's: the CohereTokenizer class, <BOS_TOKEN>, <|END_OF_TURN_TOKEN|>
// as EOS, and the chat template text when one is given.
nlohmann::json north_tokenizer_config_json(const std::string& chat_template = "");

}  // namespace megadecode
