// Generators behind sample_text.h. Every choice comes from the caller's SplitMix64, so a seed
// reproduces a corpus exactly.
#include "bench/sample_text.h"

#include <array>
#include <string_view>

#include "tokenizer/utf8.h"

namespace megadecode::sample_text {
namespace {

struct Range {
  char32_t lo, hi;
};

template <typename T, size_t N>
const T& pick(SplitMix64& rng, const std::array<T, N>& items) {
  return items[rng.below(N)];
}
char32_t in_range(SplitMix64& rng, Range r) { return r.lo + static_cast<char32_t>(rng.below(r.hi - r.lo + 1)); }
void put(std::string& s, char32_t cp) { utf8::append(s, cp); }
bool chance(SplitMix64& rng, int percent) { return rng.below(100) < static_cast<uint64_t>(percent); }

constexpr std::array<std::string_view, 40> kEnglish = {
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "tokenizer", "model", "decode", "kernel",
    "Hello", "World", "GPU", "memory", "bandwidth", "is", "a", "of", "and", "to", "in", "that", "it", "with",
    "for", "as", "was", "on", "are", "be", "this", "from", "by", "at", "The", "An", "I", "You"};
constexpr std::array<std::string_view, 24> kEuropean = {
    "café", "naïve", "über", "Straße", "Größe", "façade", "déjà", "vu", "élève", "Ærø", "smørrebrød", "Łódź",
    "привет", "мир", "Москва", "язык", "Ελληνικά", "λόγος", "ψυχή", "español", "niño", "São", "Paulo", "ĳssel"};
constexpr std::array<std::string_view, 12> kPunct = {".", ",", "!", "?", ";", ":", " -", "...", " (", ")", "\"", "—"};

void prose(std::string& s, SplitMix64& rng) {
  const int n = 3 + static_cast<int>(rng.below(25));
  for (int i = 0; i < n; ++i) {
    if (i > 0) s += ' ';
    s += chance(rng, 25) ? pick(rng, kEuropean) : pick(rng, kEnglish);
    if (chance(rng, 15)) s += pick(rng, kPunct);
  }
  if (chance(rng, 50)) s += '.';
}

constexpr std::array<std::string_view, 12> kCodeTemplates = {
    "#include <vector>\nint @(const std::vector<int>& v) {\n\tint total = 0;\n\tfor (int x : v) total += x * #;\n\treturn total;\n}\n",
    "def @(items, limit=#):\n    \"\"\"Return the first items.\"\"\"\n    result = [x ** 2 for x in items if x > 0]\n    return result[:limit]\n",
    "const @ = async (url) => {\n  const res = await fetch(`${url}?page=#`);\n  if (!res.ok) throw new Error('bad: ' + res.status);\n  return res.json();\n};\n",
    "fn @(xs: &[u32]) -> Option<u32> {\n    xs.iter().copied().filter(|&x| x % # == 0).max()\n}\n",
    "func @(ctx context.Context, n int) (int, error) {\n\tif n < # {\n\t\treturn 0, fmt.Errorf(\"n=%d\", n)\n\t}\n\treturn n * 2, nil\n}\n",
    "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id WHERE o.total > # GROUP BY u.id;\n",
    "<div class=\"@\">\n  <p>Hello &amp; welcome, item #</p>\n  <!-- comment -->\n</div>\n",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  grep -c '@' \"$f\" || echo \"none in $f\" >&2\ndone\nexit #\n",
    "{\"@\": [#, 2.5e-3, true, null], \"nested\": {\"key\": \"value with \\\"quotes\\\"\"}}\n",
    "    if (@ != nullptr && @->size() >= #) {  // check bounds\r\n        return @[#];\r\n    }\r\n",
    "x = @[i][j] + @[i-1][j+1]  # stencil, #\nassert abs(x - 3.14159) < 1e-6\n",
    "template <typename T>\nstruct @ final : public Base<T> {\n  static constexpr size_t kSize = #;\n  T data_[kSize]{};\n};\n"};

void identifier(std::string& s, SplitMix64& rng) {
  constexpr std::array<std::string_view, 10> kParts = {"get", "set", "user", "Count", "_id", "max", "Value",
                                                       "buffer", "HTTP", "x"};
  const int n = 1 + static_cast<int>(rng.below(3));
  for (int i = 0; i < n; ++i) s += pick(rng, kParts);
}

void code(std::string& s, SplitMix64& rng) {
  const int n = 1 + static_cast<int>(rng.below(3));
  for (int k = 0; k < n; ++k) {
    for (const char c : pick(rng, kCodeTemplates)) {
      if (c == '@') {
        identifier(s, rng);
      } else if (c == '#') {
        s += std::to_string(rng.below(100000));
      } else if (c == '\t' && chance(rng, 30)) {
        s += "    ";
      } else {
        s += c;
      }
    }
  }
}

void cjk(std::string& s, SplitMix64& rng) {
  constexpr std::array<std::string_view, 8> kPhrases = {"你好，世界！", "今天天气很好。", "こんにちは、元気ですか？",
                                                        "東京タワー", "안녕하세요 여러분", "机器学习模型",
                                                        "「引用」と『二重』", "ＡＢＣ１２３！"};
  constexpr std::array<Range, 7> kRanges = {Range{0x4E00, 0x9FFF}, Range{0x3041, 0x3096}, Range{0x30A1, 0x30FA},
                                            Range{0xAC00, 0xD7A3}, Range{0x3000, 0x303F}, Range{0xFF01, 0xFF5E},
                                            Range{0x20000, 0x2A6DF}};
  const int n = 1 + static_cast<int>(rng.below(6));
  for (int i = 0; i < n; ++i) {
    if (chance(rng, 40)) {
      s += pick(rng, kPhrases);
    } else {
      const Range r = pick(rng, kRanges);
      const int len = 1 + static_cast<int>(rng.below(12));
      for (int k = 0; k < len; ++k) put(s, in_range(rng, r));
    }
    if (chance(rng, 30)) s += pick(rng, kEnglish);
    if (chance(rng, 30)) s += ' ';
  }
}

void emoji(std::string& s, SplitMix64& rng) {
  constexpr std::array<Range, 4> kBases = {Range{0x1F600, 0x1F64F}, Range{0x1F300, 0x1F5FF},
                                           Range{0x1F900, 0x1F9FF}, Range{0x2600, 0x26FF}};
  constexpr std::array<char32_t, 6> kPeople = {0x1F468, 0x1F469, 0x1F466, 0x1F467, 0x1F9D1, 0x1F44D};
  const int n = 1 + static_cast<int>(rng.below(6));
  for (int i = 0; i < n; ++i) {
    switch (rng.below(6)) {
      case 0:  // ZWJ family / profession sequence, maybe with skin tones
        for (int k = 0, m = 2 + static_cast<int>(rng.below(3)); k < m; ++k) {
          if (k > 0) put(s, 0x200D);
          put(s, pick(rng, kPeople));
          if (chance(rng, 40)) put(s, in_range(rng, {0x1F3FB, 0x1F3FF}));
        }
        break;
      case 1:  // flag: two regional indicators
        put(s, in_range(rng, {0x1F1E6, 0x1F1FF}));
        put(s, in_range(rng, {0x1F1E6, 0x1F1FF}));
        break;
      case 2:  // keycap
        s += static_cast<char>('0' + rng.below(10));
        put(s, 0xFE0F);
        put(s, 0x20E3);
        break;
      case 3:  // tag sequence (subdivision flag)
        put(s, 0x1F3F4);
        for (const char c : std::string_view("gbsct")) put(s, 0xE0000 + static_cast<char32_t>(c));
        put(s, 0xE007F);
        break;
      default:  // plain emoji, maybe with a variation selector or a skin tone
        put(s, in_range(rng, pick(rng, kBases)));
        if (chance(rng, 30)) put(s, 0xFE0F);
        if (chance(rng, 20)) put(s, in_range(rng, {0x1F3FB, 0x1F3FF}));
    }
    if (chance(rng, 40)) s += ' ';
    if (chance(rng, 30)) s += pick(rng, kEnglish);
  }
}

void combining(std::string& s, SplitMix64& rng) {
  constexpr std::array<Range, 6> kMarks = {Range{0x0300, 0x036F}, Range{0x0300, 0x0315}, Range{0x0316, 0x0333},
                                           Range{0x1AB0, 0x1ACE}, Range{0x1DC0, 0x1DFF}, Range{0x20D0, 0x20F0}};
  constexpr std::array<std::string_view, 12> kSpecial = {
      "\u212B", "\u2126", "\u0344", "\u0958", "\uF900", "\u1E69", "s\u0307\u0323", "\u00C5\u0301",
      "\u09C7\u09BE", "\u0DD9\u0DCF\u0DCA", "\u1100\u1161\u11A8", "\uAC00\u11A8"};
  const int n = 1 + static_cast<int>(rng.below(8));
  for (int i = 0; i < n; ++i) {
    switch (rng.below(4)) {
      case 0:
        s += pick(rng, kSpecial);
        break;
      case 1: {  // Hangul jamo: L V (T)
        put(s, in_range(rng, {0x1100, 0x1112}));
        put(s, in_range(rng, {0x1161, 0x1175}));
        if (chance(rng, 50)) put(s, in_range(rng, {0x11A8, 0x11C2}));
        break;
      }
      default: {  // a base letter with marks in random order
        constexpr std::array<Range, 4> kBases = {Range{'a', 'z'}, Range{'A', 'Z'}, Range{0x03B1, 0x03C9},
                                                 Range{0x0430, 0x044F}};
        put(s, in_range(rng, pick(rng, kBases)));
        for (int k = 0, m = static_cast<int>(rng.below(5)); k < m; ++k) put(s, in_range(rng, pick(rng, kMarks)));
      }
    }
    if (chance(rng, 25)) s += ' ';
  }
}

void scripts(std::string& s, SplitMix64& rng) {
  struct Script {
    Range letters, marks;
  };
  constexpr std::array<Script, 7> kScripts = {
      Script{{0x0621, 0x064A}, {0x064B, 0x0652}},  // Arabic + harakat
      Script{{0x05D0, 0x05EA}, {0x05B0, 0x05BD}},  // Hebrew + points
      Script{{0x0905, 0x0939}, {0x093E, 0x094D}},  // Devanagari + matras, virama
      Script{{0x0985, 0x09B9}, {0x09BE, 0x09CD}},  // Bengali
      Script{{0x0E01, 0x0E2E}, {0x0E31, 0x0E3A}},  // Thai
      Script{{0x0D85, 0x0DC6}, {0x0DCA, 0x0DDF}},  // Sinhala
      Script{{0x0B85, 0x0BB9}, {0x0BBE, 0x0BCD}},  // Tamil
  };
  const Script& sc = pick(rng, kScripts);
  const int words = 1 + static_cast<int>(rng.below(8));
  for (int w = 0; w < words; ++w) {
    if (w > 0) s += chance(rng, 80) ? " " : "، ";
    for (int k = 0, m = 1 + static_cast<int>(rng.below(7)); k < m; ++k) {
      put(s, in_range(rng, sc.letters));
      if (chance(rng, 40)) put(s, in_range(rng, sc.marks));
    }
  }
  if (chance(rng, 30)) s += " 2024";
}

void whitespace(std::string& s, SplitMix64& rng) {
  constexpr std::array<std::string_view, 20> kSpaces = {
      " ", " ", " ", "\t", "\n", "\n", "\r\n", "\r", "\v", "\f", "\u00A0", "\u3000", "\u2028", "\u2029", "\uFEFF",
      "\u0085", "\u200B", "\u1680", "\u2003", "\u202F"};
  const int n = 1 + static_cast<int>(rng.below(5));
  for (int i = 0; i < n; ++i) {
    const int run = chance(rng, 20) ? static_cast<int>(rng.below(200)) : static_cast<int>(rng.below(6));
    const bool uniform = chance(rng, 50);
    const std::string_view one = pick(rng, kSpaces);
    for (int k = 0; k < run; ++k) s += uniform ? one : pick(rng, kSpaces);
    if (chance(rng, 70)) s += pick(rng, kEnglish);
    if (chance(rng, 20)) s += pick(rng, kPunct);
  }
}

void numbers(std::string& s, SplitMix64& rng) {
  constexpr std::array<Range, 8> kOtherDigits = {Range{0xFF10, 0xFF19}, Range{0x0660, 0x0669}, Range{0x0966, 0x096F},
                                                 Range{0x00B2, 0x00B3}, Range{0x00BC, 0x00BE}, Range{0x2160, 0x2188},
                                                 Range{0x2460, 0x249B}, Range{0x1D7CE, 0x1D7FF}};
  const int n = 1 + static_cast<int>(rng.below(6));
  for (int i = 0; i < n; ++i) {
    switch (rng.below(5)) {
      case 0:
        for (int k = 0, m = 1 + static_cast<int>(rng.below(40)); k < m; ++k) s += static_cast<char>('0' + rng.below(10));
        break;
      case 1:
        s += std::to_string(rng.below(1000));
        s += ',';
        s += std::to_string(100 + rng.below(900));
        s += '.';
        s += std::to_string(rng.below(100));
        break;
      case 2:
        s += '-';
        s += std::to_string(rng.below(100));
        s += ".5e-";
        s += std::to_string(rng.below(30));
        s += " 0x";
        s += std::to_string(rng.below(99999));
        s += "ff";
        break;
      case 3:
        for (int k = 0, m = 1 + static_cast<int>(rng.below(6)); k < m; ++k) put(s, in_range(rng, pick(rng, kOtherDigits)));
        break;
      default:
        s += 'v';
        s += std::to_string(rng.below(10));
        s += '.';
        s += std::to_string(rng.below(20));
        s += "rc1";
    }
    s += chance(rng, 60) ? " " : (chance(rng, 50) ? "%" : "apples");
  }
}

void contractions(std::string& s, SplitMix64& rng) {
  constexpr std::array<std::string_view, 7> kSuffixes = {"s", "t", "re", "ve", "m", "ll", "d"};
  constexpr std::array<std::string_view, 6> kQuotes = {"'", "'", "'", "\u2019", "''", "`"};
  const int n = 1 + static_cast<int>(rng.below(6));
  for (int i = 0; i < n; ++i) {
    s += pick(rng, kEnglish);
    s += pick(rng, kQuotes);
    for (const char c : pick(rng, kSuffixes)) s += chance(rng, 50) ? static_cast<char>(c - 'a' + 'A') : c;
    if (chance(rng, 30)) s += pick(rng, kEnglish);  // e.g. "'sthe": the contraction then the word
    if (chance(rng, 20)) s += '\'';
    s += chance(rng, 80) ? " " : "\n";
  }
}

constexpr std::array<std::string_view, 26> kAddedTokens = {
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>"};

void special_tokens(std::string& s, SplitMix64& rng) {
  constexpr std::array<std::string_view, 8> kNearMisses = {"<|im_start", "<think", "</think >", "<|endoftext|",
                                                           "< think>", "<|IM_END|>", "<<|im_end|>>", "|>"};
  const int n = 1 + static_cast<int>(rng.below(8));
  for (int i = 0; i < n; ++i) {
    const uint64_t r = rng.below(10);
    if (r < 5) {
      s += pick(rng, kAddedTokens);
    } else if (r < 6) {
      s += pick(rng, kNearMisses);
    } else if (r < 8) {
      prose(s, rng);
    } else {
      s += chance(rng, 50) ? "\n" : " ";
    }
  }
}

void long_words(std::string& s, SplitMix64& rng) {
  const int len = 200 + static_cast<int>(rng.below(chance(rng, 10) ? 20000 : 3000));
  switch (rng.below(6)) {
    case 0:
      for (int k = 0; k < len; ++k) s += static_cast<char>('a' + rng.below(26));
      break;
    case 1:
      s.append(static_cast<size_t>(len), static_cast<char>('a' + rng.below(26)));
      break;
    case 2:
      for (int k = 0; k < len / 3; ++k) put(s, in_range(rng, {0x4E00, 0x9FFF}));
      break;
    case 3:
      for (int k = 0; k < len; ++k) s += static_cast<char>('0' + rng.below(10));
      break;
    case 4:
      s.append(static_cast<size_t>(len), "!=-*#_"[rng.below(6)]);
      break;
    default:
      for (int k = 0; k < len / 2; ++k) s += pick(rng, kEuropean);
  }
}

void random_code_points(std::string& s, SplitMix64& rng) {
  const int n = 1 + static_cast<int>(rng.below(40));
  for (int i = 0; i < n; ++i) {
    const uint64_t r = rng.below(100);
    char32_t cp;
    if (r < 45) {
      cp = in_range(rng, {0x20, 0x7E});
    } else if (r < 55) {
      cp = in_range(rng, {0x00, 0x1F});
    } else if (r < 65) {
      cp = in_range(rng, {0x7F, 0x2FF});
    } else if (r < 90) {
      do cp = in_range(rng, {0x300, 0xFFFF}); while (cp >= 0xD800 && cp <= 0xDFFF);
    } else {
      cp = in_range(rng, {0x10000, 0x10FFFF});
    }
    put(s, cp);
  }
}

}  // namespace

const char* kind_name(Kind kind) {
  constexpr std::array<const char*, kNumKinds> kNames = {"prose", "code", "cjk", "emoji", "combining", "scripts",
                                                         "whitespace", "numbers", "contractions", "special_tokens",
                                                         "long_words", "random"};
  return kNames[static_cast<size_t>(kind)];
}

std::string generate(Kind kind, SplitMix64& rng) {
  std::string s;
  switch (kind) {
    case Kind::kProse: prose(s, rng); break;
    case Kind::kCode: code(s, rng); break;
    case Kind::kCjk: cjk(s, rng); break;
    case Kind::kEmoji: emoji(s, rng); break;
    case Kind::kCombining: combining(s, rng); break;
    case Kind::kScripts: scripts(s, rng); break;
    case Kind::kWhitespace: whitespace(s, rng); break;
    case Kind::kNumbers: numbers(s, rng); break;
    case Kind::kContractions: contractions(s, rng); break;
    case Kind::kSpecialTokens: special_tokens(s, rng); break;
    case Kind::kLongWords: long_words(s, rng); break;
    case Kind::kRandom: random_code_points(s, rng); break;
  }
  return s;
}

std::vector<std::string> corpus(uint64_t seed, int n_per_kind) {
  std::vector<std::string> out = {"", " ", "\n", "a", "'s", "'S", "'", "  ", "\r\n", "\t\t", "é", "e\u0301", "🙂",
                                  "<|im_end|>", "<|im_start|>user\nhi<|im_end|>\n", "<think>\n\n</think>\n\n"};
  for (const std::string_view t : kAddedTokens) out.emplace_back(t);
  SplitMix64 rng(seed);
  for (int k = 0; k < kNumKinds; ++k) {
    for (int i = 0; i < n_per_kind; ++i) out.push_back(generate(static_cast<Kind>(k), rng));
  }
  // Random mixes: several kinds glued together.
  for (int i = 0; i < n_per_kind; ++i) {
    std::string s;
    for (int k = 0, m = 2 + static_cast<int>(rng.below(4)); k < m; ++k) {
      const auto kind = static_cast<Kind>(rng.below(kNumKinds));
      if (kind != Kind::kLongWords) s += generate(kind, rng);
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::string text_of_kind(Kind kind, uint64_t seed, size_t n_bytes) {
  SplitMix64 rng(seed);
  std::string out;
  while (out.size() < n_bytes) {
    out += generate(kind, rng);
    out += ' ';
  }
  return out;
}

std::string mixed_text(uint64_t seed, size_t n_bytes) {
  // Weights per kind (percent of samples): realistic text dominates. No kLongWords: a few
  // multi-kilobyte words would be a third of the bytes (bench them separately).
  constexpr std::array<int, kNumKinds> kWeights = {40, 25, 8, 3, 2, 3, 5, 5, 5, 3, 0, 1};
  SplitMix64 rng(seed);
  std::string out;
  while (out.size() < n_bytes) {
    uint64_t r = rng.below(100);
    int k = 0;
    while (r >= static_cast<uint64_t>(kWeights[static_cast<size_t>(k)])) r -= static_cast<uint64_t>(kWeights[static_cast<size_t>(k++)]);
    out += generate(static_cast<Kind>(k), rng);
    out += chance(rng, 50) ? "\n" : " ";
  }
  return out;
}

}  // namespace megadecode::sample_text
