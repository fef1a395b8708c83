// Tokenizer::load: reads tokenizer.json and tokenizer_config.json and checks that every stage is
// one this implementation reproduces exactly (byte-level BPE; normalizer NFC; pre-tokenizer stages
// Split with a known pattern, Digits, ByteLevel last); anything else is an Error naming the file
// and the stage, never a silently different tokenization.
#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/check.h"
#include "tokenizer/bpe_tokenizer.h"

namespace megadecode {
namespace {

using nlohmann::json;

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  MD_REQUIRE(in, "cannot open ", path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    return json::parse(buffer.str());
  } catch (const json::exception& e) {
    throw Error(cat(path.string(), ": not valid JSON: ", e.what()));
  }
}

bool is_false_or_absent(const json& obj, const char* key) {
  return !obj.contains(key) || obj[key].is_null() || (obj[key].is_boolean() && !obj[key].get<bool>());
}

bool is_empty_or_absent(const json& obj, const char* key) {
  return !obj.contains(key) || obj[key].is_null() || (obj[key].is_string() && obj[key].get<std::string>().empty());
}

// A ByteLevel post-processor or decoder: its flags change offsets only, never ids or text.
bool is_byte_level(const json& j) { return j.is_object() && j.value("type", "") == "ByteLevel"; }

bool bool_flag(const json& obj, const char* key, bool absent) {
  if (!obj.contains(key) || obj[key].is_null()) return absent;
  return obj[key].is_boolean() && obj[key].get<bool>();
}

// A token name in tokenizer_config.json: a string or an AddedToken object with "content".
std::optional<std::string> token_name(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return std::nullopt;
}

// What a pipeline stage is, for the error that refuses it: its type, a Sequence's parts, a Split's
// pattern and the ByteLevel / Digits flags that change what they do.
std::string describe_stage(const json& j) {
  if (j.is_null()) return "none";
  if (!j.is_object()) return j.dump();
  const std::string type = j.value("type", std::string("(no type)"));
  std::string flags;
  auto flag = [&](const char* key) {
    if (j.contains(key) && j[key].is_boolean() && j[key].get<bool>()) flags += cat(flags.empty() ? "" : ", ", key);
  };
  if (type == "Sequence") {
    std::string parts;
    for (const char* key : {"pretokenizers", "decoders", "processors", "normalizers"}) {
      for (const json& p : j.value(key, json::array())) parts += cat(parts.empty() ? "" : ", ", describe_stage(p));
    }
    return cat("Sequence[", parts, "]");
  }
  if (type == "Split" && j.contains("pattern") && j["pattern"].is_object())
    return cat("Split(", j["pattern"].dump(), ", ", j.value("behavior", std::string("?")), ")");
  flag("add_prefix_space");
  flag("use_regex");
  flag("individual_digits");
  return flags.empty() ? type : cat(type, "(", flags, ")");
}

// The Split delimiter behaviour named in tokenizer.json.
std::optional<SplitBehavior> split_behavior(const std::string& name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return std::nullopt;
}

// Appends the stages of pre-tokenizer j (a Sequence flattened); refuses what is not implemented,
// naming the whole pre_tokenizer and the stage.
void read_stages(const json& j, const json& whole, const std::string& file, std::vector<PreTokenizerStage>& stages) {
  auto refuse = [&](const std::string& why) {
    throw Error(cat(file, ": unsupported pre_tokenizer ", describe_stage(whole), ": ", why));
  };
  const std::string type = j.is_object() ? j.value("type", std::string()) : std::string();
  PreTokenizerStage stage;
  if (type == "Sequence" && j.contains("pretokenizers") && j["pretokenizers"].is_array()) {
    for (const json& p : j["pretokenizers"]) read_stages(p, whole, file, stages);
    return;
  } else if (type == "Split") {
    stage.type = PreTokenizerStage::Type::kSplit;
    const json& pattern = j.value("pattern", json());
    if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
      const auto p = split_pattern_from_regex(pattern["Regex"].get<std::string>());
      if (!p) {
        refuse(cat("the Split regex ", pattern["Regex"].dump(), " is not one this tokenizer implements (the Qwen2, "
                   "GPT-2, North digit-group and GPT-4o-style patterns of split_patterns.h)"));
      }
      stage.pattern = *p;
    } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string() &&
               !pattern["String"].get<std::string>().empty()) {
      stage.literal = pattern["String"].get<std::string>();
    } else {
      refuse(cat("Split needs a pattern {\"Regex\": ...} or a non-empty {\"String\": ...}, not ", pattern.dump()));
    }
    const auto behavior = split_behavior(j.value("behavior", std::string()));
    if (!behavior) refuse(cat("unknown Split behavior ", j.value("behavior", json()).dump()));
    stage.behavior = *behavior;
    stage.invert = bool_flag(j, "invert", false);
  } else if (type == "Digits") {
    stage.type = PreTokenizerStage::Type::kDigits;
    stage.individual_digits = bool_flag(j, "individual_digits", false);
  } else if (type == "ByteLevel") {
    stage.type = PreTokenizerStage::Type::kByteLevel;
    stage.add_prefix_space = bool_flag(j, "add_prefix_space", true);
    stage.use_regex = bool_flag(j, "use_regex", true);
  } else {
    refuse(cat("the stage ", describe_stage(j), " is not implemented (implemented: Sequence, Split, Digits, ByteLevel)"));
  }
  if (!stages.empty() && stages.back().type == PreTokenizerStage::Type::kByteLevel) {
    refuse(cat("the stage ", describe_stage(j), " follows ByteLevel (it would see the byte-level alphabet)"));
  }
  stages.push_back(std::move(stage));
}

// Reads the post_processor: none, ByteLevel, TemplateProcessing (its "single" template: special
// tokens around sequence A) or a Sequence of them.
void read_post_processor(const json& post, const json& whole, const std::string& file, BpeTokenizerSpec& spec,
                         bool* seen_template) {
  if (post.is_null() || is_byte_level(post)) return;
  const std::string type = post.is_object() ? post.value("type", std::string()) : std::string();
  auto refuse = [&](const std::string& why) {
    throw Error(cat(file, ": unsupported post_processor ", describe_stage(whole), ": ", why,
                    " (supported: none, ByteLevel, TemplateProcessing, a Sequence of them)"));
  };
  if (type == "Sequence" && post.value("processors", json()).is_array()) {
    for (const json& p : post["processors"]) read_post_processor(p, whole, file, spec, seen_template);
    return;
  }
  if (type != "TemplateProcessing") refuse(cat("the processor ", describe_stage(post), " is not implemented"));
  if (*seen_template) refuse("more than one TemplateProcessing");
  *seen_template = true;
  const json& single = post.value("single", json());
  const json& special = post.value("special_tokens", json::object());
  if (!single.is_array()) refuse("TemplateProcessing has no \"single\" template");
  bool seen_a = false;
  for (const json& item : single) {
    if (item.contains("Sequence") && item["Sequence"].value("id", "") == "A" && !seen_a) {
      seen_a = true;
    } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id")) {
      const json& name = item["SpecialToken"]["id"];
      const json& ids = name.is_string() && special.contains(name.get<std::string>())
                            ? special[name.get<std::string>()].value("ids", json())
                            : json();
      if (!ids.is_array()) refuse(cat("the special token ", name.dump(), " has no ids in special_tokens"));
      for (const json& id : ids) {
        if (!id.is_number_integer()) refuse(cat("the special token ", name.dump(), " has an id that is not an integer"));
        (seen_a ? spec.suffix_ids : spec.prefix_ids).push_back(id.get<int32_t>());
      }
    } else {
      refuse(cat("TemplateProcessing item ", item.dump(), " is not a SpecialToken or the one Sequence A"));
    }
  }
  if (!seen_a) refuse("TemplateProcessing's \"single\" template has no Sequence A");
}

// Checks every stage of tokenizer.json; returns the pre-tokenizer.
PreTokenizer check_stages(const json& tj, const std::string& file) {
  const json& norm = tj.value("normalizer", json());
  const bool nfc_sequence = norm.is_object() && norm.value("type", "") == "Sequence" &&
                            norm.value("normalizers", json()).is_array() &&
                            std::all_of(norm["normalizers"].begin(), norm["normalizers"].end(),
                                        [](const json& n) { return n.is_object() && n.value("type", "") == "NFC"; });
  MD_REQUIRE(norm.is_null() || (norm.is_object() && norm.value("type", "") == "NFC") || nfc_sequence, file,
             ": unsupported normalizer (supported: none or NFC): ", norm.dump());
  const json& pre = tj.value("pre_tokenizer", json());
  std::vector<PreTokenizerStage> stages;
  if (!pre.is_null()) read_stages(pre, pre, file, stages);
  MD_REQUIRE(!stages.empty() && stages.back().type == PreTokenizerStage::Type::kByteLevel, file,
             ": unsupported pre_tokenizer ", describe_stage(pre),
             ": the byte-level BPE vocabulary needs ByteLevel as the last stage");
  MD_REQUIRE(is_byte_level(tj.value("decoder", json())), file, ": unsupported decoder ",
             describe_stage(tj.value("decoder", json())), " (supported: ByteLevel)");
  const json& model = tj.value("model", json());
  MD_REQUIRE(model.is_object() && model.value("type", "") == "BPE", file, ": model.type must be BPE");
  MD_REQUIRE(is_false_or_absent(model, "byte_fallback") && is_false_or_absent(model, "ignore_merges") &&
                 is_empty_or_absent(model, "continuing_subword_prefix") &&
                 is_empty_or_absent(model, "end_of_word_suffix") && is_false_or_absent(model, "dropout"),
             file, ": unsupported BPE options (byte_fallback, ignore_merges, subword affixes or dropout)");
  return PreTokenizer(std::move(stages));
}

std::unique_ptr<BpeModel> read_model(const json& model, const std::string& file) {
  const json& vocab = model.value("vocab", json());
  MD_REQUIRE(vocab.is_object() && !vocab.empty(), file, ": model.vocab must be a non-empty object");
  std::vector<std::string> tokens(vocab.size());
  std::vector<bool> seen(vocab.size(), false);
  for (const auto& [name, id_json] : vocab.items()) {
    MD_REQUIRE(id_json.is_number_integer(), file, ": vocab id of \"", name, "\" is not an integer");
    const auto id = id_json.get<int64_t>();
    MD_REQUIRE(id >= 0 && id < static_cast<int64_t>(tokens.size()) && !seen[static_cast<size_t>(id)], file,
               ": vocab ids must be 0..", tokens.size() - 1, " without repeats (\"", name, "\" has ", id, ")");
    seen[static_cast<size_t>(id)] = true;
    MD_REQUIRE(byte_level_decode(name, &tokens[static_cast<size_t>(id)]), file, ": vocab token \"", name,
               "\" has a character outside the ByteLevel alphabet");
  }
  const json& merges_json = model.value("merges", json::array());
  MD_REQUIRE(merges_json.is_array(), file, ": model.merges must be an array");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_json.size());
  for (const json& m : merges_json) {
    std::string left, right;
    if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["a", "b"]
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else if (m.is_string() && m.get<std::string>().find(' ') != std::string::npos) {  // "a b"
      const std::string s = m.get<std::string>();
      left = s.substr(0, s.find(' '));
      right = s.substr(s.find(' ') + 1);
    } else {
      throw Error(cat(file, ": malformed merge #", merges.size(), ": ", m.dump()));
    }
    std::string l, r;
    MD_REQUIRE(byte_level_decode(left, &l) && byte_level_decode(right, &r), file, ": merge #", merges.size(),
               " has a character outside the ByteLevel alphabet");
    merges.emplace_back(std::move(l), std::move(r));
  }
  return std::make_unique<BpeModel>(std::move(tokens), merges);
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::filesystem::path& model_dir) {
  const std::filesystem::path tokenizer_path = model_dir / "tokenizer.json";
  const std::filesystem::path config_path = model_dir / "tokenizer_config.json";
  const std::string file = tokenizer_path.string();
  MD_REQUIRE(std::filesystem::exists(tokenizer_path), model_dir.string(),
             " has no tokenizer.json: give the model its tokenizer files, or serve token ids with "
             "--skip-tokenizer-init");
  const json tj = read_json(tokenizer_path);
  const json config = read_json(config_path);
  MD_REQUIRE(tj.is_object(), file, ": not a JSON object");
  MD_REQUIRE(config.is_object(), config_path.string(), ": not a JSON object");
  BpeTokenizerSpec spec;
  spec.pre_tokenizer = check_stages(tj, file);
  bool seen_template = false;
  read_post_processor(tj.value("post_processor", json()), tj.value("post_processor", json()), file, spec, &seen_template);
  const json& norm = tj["normalizer"];
  spec.nfc = norm.is_object() && (norm.value("type", "") == "NFC" || !norm.value("normalizers", json::array()).empty());
  spec.model = read_model(tj["model"], file);
  for (const json& t : tj.value("added_tokens", json::array())) {
    MD_REQUIRE(t.is_object() && t.contains("id") && t["id"].is_number_integer() && t.contains("content") &&
                   t["content"].is_string(),
               file, ": malformed added token ", t.dump());
    const auto id = t["id"].get<int64_t>();
    MD_REQUIRE(id >= 0 && id < (int64_t{1} << 24), file, ": added token id ", id, " is out of range");
    AddedTokenSpec token{static_cast<int32_t>(id), t["content"].get<std::string>()};
    token.special = bool_flag(t, "special", false);
    token.single_word = bool_flag(t, "single_word", false);
    token.lstrip = bool_flag(t, "lstrip", false);
    token.rstrip = bool_flag(t, "rstrip", false);
    token.normalized = bool_flag(t, "normalized", !token.special);  // HF's default for a token without the flag
    spec.added_tokens.push_back(std::move(token));
  }
  for (const json& t : config.value("additional_special_tokens", json::array())) {
    if (auto name = token_name(t)) spec.extra_special.push_back(*name);
  }
  if (config.contains("eos_token")) spec.eos_token = token_name(config["eos_token"]);
  return std::make_unique<BpeTokenizer>(std::move(spec));
}

}  // namespace megadecode
