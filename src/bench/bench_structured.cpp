// `megadecode bench structured [--model DIR] [--vocab N] [--walks W] [--seed S] [--json FILE]`:
// the structured-output engine's host cost on one core: grammar compile time (cold: schema ->
// grammar -> matcher; cached: a compile-cache hit) and the time of one row's token mask per step
// along random valid walks (sampling uniformly among allowed tokens, closing tokens likelier as
// the output grows), for a tool-call-sized schema, a 20-property schema, JSON mode and the same
// tool as a Qwen3-Coder XML call, on a synthetic BPE-like vocabulary of N tokens (152K by
// default) and, with --model, a real tokenizer's.
// Mask times are reported over all steps (the first walk computes each grammar node's token set
// on first use) and over the walks after the first (steady state).
#include <algorithm>
#include <ctime>
#include <cstdio>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "core/args.h"
#include "core/check.h"
#include "core/json_file.h"
#include "core/rng.h"
#include "core/stopwatch.h"
#include "structured/compiler.h"
#include "tokenizer/tokenizer.h"

namespace megadecode {
namespace {

using structured::Compiler;
using structured::Spec;
using structured::Vocabulary;

constexpr const char* kToolCallSchema = R"({
  "type": "object",
  "properties": {
    "name": {"const": "get_weather"},
    "arguments": {
      "type": "object",
      "properties": {
        "location": {"type": "string", "description": "City and country, e.g. Paris, France"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "include_hourly": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4}
      },
      "required": ["location", "unit"]
    }
  },
  "required": ["name", "arguments"]
})";

// The same tool as Qwen3-Coder's XML call (structured/xml_call.h): the call's arguments schema as
// its parameters (raw text, enum text, JSON values).
std::string coder_tools() {
  const nlohmann::ordered_json call = nlohmann::ordered_json::parse(kToolCallSchema);
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  tools.push_back({{"name", call["properties"]["name"]["const"]}, {"parameters", call["properties"]["arguments"]}});
  return tools.dump();
}

std::string twenty_property_schema() {
  nlohmann::ordered_json props = nlohmann::ordered_json::object();
  const char* kinds[] = {"string", "integer", "number", "boolean", "enum", "date", "array", "object", "short", "uuid"};
  for (int i = 0; i < 20; ++i) {
    const std::string k = kinds[i % 10];
    nlohmann::ordered_json p;
    if (k == "enum") p = {{"enum", {"low", "medium", "high", nullptr}}};
    else if (k == "date") p = {{"type", "string"}, {"format", "date"}};
    else if (k == "uuid") p = {{"type", "string"}, {"format", "uuid"}};
    else if (k == "short") p = {{"type", "string"}, {"maxLength", 24}};
    else if (k == "array") p = {{"type", "array"}, {"items", {{"type", "integer"}, {"minimum", 0}, {"maximum", 1000}}}, {"maxItems", 6}};
    else if (k == "object")
      p = {{"type", "object"},
           {"properties", {{"street", {{"type", "string"}}}, {"zip", {{"type", "string"}, {"maxLength", 10}}}}},
           {"required", {"street"}}};
    else p = {{"type", k}};
    props["field_" + std::to_string(i) + "_" + k] = p;
  }
  nlohmann::ordered_json required = nlohmann::ordered_json::array();
  for (int i = 0; i < 20; i += 2) required.push_back("field_" + std::to_string(i) + "_" + kinds[i % 10]);
  return nlohmann::ordered_json({{"type", "object"}, {"properties", props}, {"required", required}}).dump();
}

// A byte-level-BPE-like vocabulary: the 256 bytes, words with and without a leading space and
// capital, digit runs, punctuation and JSON structure runs ("\",", "\"}", "{\"", "\":\""),
// whitespace runs, UTF-8 characters and pieces of them; then 200 special tokens, the last the end.
Vocabulary synthetic_vocab(uint64_t seed, int n) {
  SplitMix64 rng(seed);
  std::vector<std::string> bytes;
  std::set<std::string> seen;
  for (int b = 0; b < 256; ++b) {
    bytes.push_back(std::string(1, static_cast<char>(b)));
    seen.insert(bytes.back());
  }
  const std::string letters = "etaoinshrdlucmfwypvbgkjqxz";
  const std::vector<std::string> punct = {"\"", ",", ":", "{", "}", "[", "]", ".", "(", ")", ";", "_", "-", "/", "\\", "'", "!", "?", "=", "<", ">", "\n", " ", "  ", "\t"};
  const std::vector<std::string> utf8 = {"é", "ü", "ñ", "中", "文", "日", "本", "😀", "の", "в", "и", "\xE4\xB8", "\x80", "\xAD"};
  const int n_special = 200;
  while (static_cast<int>(bytes.size()) < n - n_special) {
    std::string s;
    const uint64_t kind = rng.below(100);
    if (kind < 60) {  // a word
      if (rng.below(2)) s += ' ';
      const int len = 1 + static_cast<int>(rng.below(9));
      for (int i = 0; i < len; ++i) s += letters[std::min<uint64_t>(rng.below(26), rng.below(26))];
      if (rng.below(5) == 0) s[s[0] == ' ' ? 1 : 0] = static_cast<char>(std::toupper(s[s[0] == ' ' ? 1 : 0]));
    } else if (kind < 68) {  // digits
      const int len = 1 + static_cast<int>(rng.below(3));
      for (int i = 0; i < len; ++i) s += static_cast<char>('0' + rng.below(10));
    } else if (kind < 88) {  // punctuation and structure, maybe glued to a word
      const int len = 1 + static_cast<int>(rng.below(3));
      for (int i = 0; i < len; ++i) s += punct[rng.below(punct.size())];
      if (rng.below(3) == 0) s += letters.substr(rng.below(20), 1 + rng.below(5));
    } else if (kind < 94) {  // whitespace runs
      s = rng.below(2) ? "\n" : "";
      s += std::string(1 + rng.below(12), ' ');
    } else {  // UTF-8
      const int len = 1 + static_cast<int>(rng.below(3));
      for (int i = 0; i < len; ++i) s += utf8[rng.below(utf8.size())];
    }
    if (seen.insert(s).second) bytes.push_back(s);
  }
  std::vector<bool> text(bytes.size(), true);
  for (int i = 0; i < n_special; ++i) {
    bytes.push_back("<|special_" + std::to_string(i) + "|>");
    text.push_back(false);
  }
  return Vocabulary(std::move(bytes), std::move(text), {n - 1});
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(v.size())));
  return v[i];
}

// CPU time of this thread (the figure for one core when other processes share the machine).
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Result {
  std::string vocab, schema;
  int vocab_size = 0;
  double compile_cold_ms = 0, compile_cached_us = 0;
  std::vector<double> all_us, warm_us, all_cpu_us, warm_cpu_us;
  int walks = 0, complete = 0, tokens = 0;
  double first_walk_ms = 0;
  size_t states = 0, token_sets = 0, grammar_nodes = 0;
};

Result run(const std::string& vocab_name, std::shared_ptr<const Vocabulary> vocab, const std::string& spec_name,
           const Spec& spec, int n_walks, uint64_t seed) {
  Result r;
  r.vocab = vocab_name;
  r.schema = spec_name;
  r.vocab_size = vocab->size();
  std::vector<double> cold;
  for (int i = 0; i < 20; ++i) {
    const Stopwatch t;
    const auto g = std::make_shared<structured::CompiledGrammar>(structured::build_grammar(spec), vocab);
    cold.push_back(t.ms());
  }
  r.compile_cold_ms = percentile(cold, 50);
  Compiler compiler(vocab);
  const auto grammar = compiler.compile(spec);
  std::vector<double> cached;
  for (int i = 0; i < 1000; ++i) {
    const Stopwatch t;
    MD_CHECK(compiler.compile(spec) == grammar);
    cached.push_back(t.seconds() * 1e6);
  }
  r.compile_cached_us = percentile(cached, 50);
  r.grammar_nodes = grammar->n_nodes();

  SplitMix64 rng(seed);
  std::vector<bool> closer(vocab->size());
  for (int32_t id = 0; id < vocab->size(); ++id) {
    const std::string& b = vocab->bytes(id);
    closer[id] = vocab->is_end(id) || b == "\"" || b == "}" || b == "]" || b == "\"}" || b == "\",";
  }
  // An XML call's raw text ends only where the walk spells "\n</parameter>\n": there a closer is a
  // token that goes on with one of the ends from as much of it as the output already ends with.
  const bool xml = spec.kind == structured::SpecKind::kXmlCall;
  const std::string_view xml_ends[] = {"\n</parameter>\n", "</function>\n"};
  std::string tail;                 // the output's last bytes (xml)
  std::string_view rest[2];         // what is left of each end after the output's tail
  auto find_rests = [&] {
    size_t matched[2];
    for (int i = 0; i < 2; ++i) {
      const std::string_view end = xml_ends[i];
      matched[i] = std::min(tail.size(), end.size() - 1);
      while (matched[i] > 0 && std::string_view(tail).substr(tail.size() - matched[i]) != end.substr(0, matched[i]))
        --matched[i];
      rest[i] = end.substr(matched[i]);
    }
    // The end already begun goes on; a fresh start of the other would undo it.
    if (matched[0] > matched[1]) rest[1] = {};
    if (matched[1] > matched[0]) rest[0] = {};
  };
  auto continues_an_end = [&](const std::string& b) {
    return !b.empty() && ((!rest[0].empty() && rest[0].starts_with(b)) || (!rest[1].empty() && rest[1].starts_with(b)));
  };
  std::vector<uint32_t> words(token_mask_words(vocab->size()));
  std::vector<int32_t> allowed, closers, xml_closers;
  for (int w = 0; w < n_walks; ++w) {
    structured::GrammarConstraint c(grammar);
    tail.clear();
    double walk_mask_ms = 0;
    bool complete = false;
    for (int step = 0; step < 2000 && !complete; ++step) {
      if (c.finished()) {
        complete = true;
        break;
      }
      const double c0 = thread_cpu_seconds();
      const Stopwatch t;
      c.fill_mask(words);
      const double us = t.seconds() * 1e6;
      const double cpu_us = (thread_cpu_seconds() - c0) * 1e6;
      walk_mask_ms += us / 1e3;
      r.all_us.push_back(us);
      r.all_cpu_us.push_back(cpu_us);
      if (w > 0) {
        r.warm_us.push_back(us);
        r.warm_cpu_us.push_back(cpu_us);
      }
      allowed.clear();
      closers.clear();
      xml_closers.clear();
      if (xml) find_rests();
      for (size_t wi = 0; wi < words.size(); ++wi) {
        for (uint32_t bits = words[wi]; bits != 0; bits &= bits - 1) {
        const int32_t id = static_cast<int32_t>(wi * 32 + static_cast<size_t>(__builtin_ctz(bits)));
        allowed.push_back(id);
        if (xml && continues_an_end(vocab->bytes(id))) xml_closers.push_back(id);
        if (closer[id]) closers.push_back(id);
        }
      }
      // An XML call closes by its own ends where the output can go on with one (raw text would
      // take a JSON closer as more text).
      const std::vector<int32_t>& closing = xml_closers.empty() ? closers : xml_closers;
      const bool close = !closing.empty() && rng.below(100) < static_cast<uint64_t>(std::min(90, 5 + step));
      const std::vector<int32_t>& from = close ? closing : allowed;
      const int32_t t_id = from[rng.below(from.size())];
      MD_CHECK(c.accept(t_id), "an allowed token was refused");
      if (xml) tail = (tail + vocab->bytes(t_id)).substr(std::max<size_t>(tail.size() + vocab->bytes(t_id).size(), 16) - 16);
      ++r.tokens;
      if (vocab->is_end(t_id)) complete = true;
    }
    if (w == 0) r.first_walk_ms = walk_mask_ms;
    r.complete += complete;
    ++r.walks;
  }
  r.states = grammar->n_states();
  r.token_sets = grammar->n_local_sets();
  return r;
}

}  // namespace

int bench_structured(int argc, char** argv) {
  const Args args(argc, argv, {"model", "vocab", "walks", "seed", "json"}, {"help"});
  if (args.flag("help")) {
    std::printf("usage: megadecode bench structured [--model DIR (a tokenizer besides the synthetic vocabulary)]\n"
                "                                   [--vocab N (152064)] [--walks W (40)] [--seed S (1)] [--json FILE]\n");
    return 0;
  }
  const int n_vocab = args.get_int32("vocab", 152064);
  const int n_walks = args.get_int32("walks", 40);
  const uint64_t seed = static_cast<uint64_t>(args.get_int("seed", 1));
  MD_REQUIRE(n_vocab >= 1024 && n_walks >= 2, "--vocab must be at least 1024 and --walks at least 2");

  std::vector<std::pair<std::string, std::shared_ptr<const Vocabulary>>> vocabs;
  Stopwatch t;
  vocabs.emplace_back("synthetic-" + std::to_string(n_vocab), std::make_shared<const Vocabulary>(synthetic_vocab(seed, n_vocab)));
  const double synth_ms = t.ms();
  double model_ms = 0;
  if (args.has("model")) {
    const std::unique_ptr<Tokenizer> tok = Tokenizer::load(args.get("model", ""));
    std::vector<int32_t> ends;
    for (const char* name : {"<|im_end|>", "<|endoftext|>", "<|END_OF_TURN_TOKEN|>"})
      if (const auto id = tok->token_id(name)) ends.push_back(*id);
    if (ends.empty() && tok->eos_token_id()) ends.push_back(*tok->eos_token_id());
    MD_REQUIRE(!ends.empty(), "--model: the tokenizer names no end token");
    t.restart();
    vocabs.emplace_back(args.get("model", ""), std::make_shared<const Vocabulary>(Vocabulary::from_tokenizer(*tok, ends)));
    model_ms = t.ms();
  }
  const std::vector<std::pair<std::string, Spec>> specs = {{"tool-call", Spec::json_schema(kToolCallSchema)},
                                                           {"20-property", Spec::json_schema(twenty_property_schema())},
                                                           {"json-mode", Spec::json_object()},
                                                           {"coder-call", Spec::xml_call(coder_tools())}};
  std::printf("structured-output benchmark: one thread; vocabulary trie built in %.0f ms (synthetic)%s\n", synth_ms,
              args.has("model") ? cat(", ", static_cast<int>(model_ms), " ms (", args.get("model", ""), ")").c_str() : "");
  std::printf("  %-22s %-11s %8s %7s | %6s %6s %6s %6s | %6s %6s %6s | %7s | %5s %5s\n", "vocabulary", "schema", "compile",
              "cached", "p50", "p99", "cpu99", "max", "warm50", "warm99", "wcpu99", "1st ms", "steps", "done");
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& [vname, vocab] : vocabs) {
    for (const auto& [sname, spec] : specs) {
      const Result r = run(vname, vocab, sname, spec, n_walks, seed);
      const double p50 = percentile(r.all_us, 50), p99 = percentile(r.all_us, 99), mx = percentile(r.all_us, 100);
      const double w50 = percentile(r.warm_us, 50), w99 = percentile(r.warm_us, 99);
      const double cpu99 = percentile(r.all_cpu_us, 99), wcpu99 = percentile(r.warm_cpu_us, 99);
      std::printf("  %-22s %-11s %6.2fms %5.2fus | %6.1f %6.1f %6.1f %6.0f | %6.1f %6.1f %6.1f | %7.1f | %5zu %2d/%-2d\n",
                  vname.substr(std::max<size_t>(vname.size(), 22) - 22).c_str(), sname.c_str(), r.compile_cold_ms,
                  r.compile_cached_us, p50, p99, cpu99, mx, w50, w99, wcpu99, r.first_walk_ms, r.all_us.size(), r.complete,
                  r.walks);
      rows.push_back({{"vocabulary", vname},
                      {"vocab_size", r.vocab_size},
                      {"schema", sname},
                      {"compile_cold_ms_p50", r.compile_cold_ms},
                      {"compile_cached_us_p50", r.compile_cached_us},
                      {"grammar_nodes", r.grammar_nodes},
                      {"mask_us_p50", p50},
                      {"mask_us_p99", p99},
                      {"mask_cpu_us_p99", cpu99},
                      {"mask_cpu_us_p99_after_first_walk", wcpu99},
                      {"mask_us_max", mx},
                      {"mask_us_p50_after_first_walk", w50},
                      {"mask_us_p99_after_first_walk", w99},
                      {"first_walk_mask_ms_total", r.first_walk_ms},
                      {"steps", r.all_us.size()},
                      {"walks", r.walks},
                      {"walks_complete", r.complete},
                      {"states", r.states},
                      {"token_sets", r.token_sets}});
    }
  }
  std::printf("  compile: schema -> grammar -> matcher (median of 20); cached: a compile-cache hit (median of 1000)\n"
              "  p50/p99/max: wall us of every step's mask (token sets computed on first use included); cpu99: the\n"
              "  thread's CPU time (no preemption); warm50/99, wcpu99: walks 2..W; 1st ms: the first walk's mask time\n");
  if (args.has("json")) {
    write_json(args.get("json", ""), {{"benchmark", "structured"},
                                      {"seed", seed},
                                      {"walks_per_row", n_walks},
                                      {"synthetic_trie_ms", synth_ms},
                                      {"rows", rows}});
  }
  return 0;
}

}  // namespace megadecode
