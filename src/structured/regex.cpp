// Regex subset: a recursive-descent parser to a small tree, then Thompson fragments (a counted
// repetition builds its operand again for each copy).
#include "structured/regex.h"

#include <bitset>
#include <cctype>
#include <memory>
#include <vector>

#include "core/check.h"

namespace megadecode::structured {
namespace {

constexpr int kMaxRepeat = 256;

struct Re {
  enum Kind { kClass, kLiteral, kSeq, kAlt, kRepeat } kind;
  std::bitset<128> ascii;      // kClass: the ASCII characters
  bool negated = false;        // kClass: any character (UTF-8 too) but those
  std::string bytes;           // kLiteral: one character's bytes
  std::vector<std::unique_ptr<Re>> parts;  // kSeq, kAlt, kRepeat (one)
  int min = 0, max = 0;        // kRepeat (max < 0: no limit)
};

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  std::unique_ptr<Re> parse() {
    if (at('^')) ++i_;
    auto r = alternation();
    if (at('$')) ++i_;
    if (i_ != p_.size()) fail("unexpected character");
    return r;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw Error(cat("regex: ", why, " at offset ", i_, " of \"", p_, "\""));
  }
  bool at(char c) const { return i_ < p_.size() && p_[i_] == c; }
  bool more() const { return i_ < p_.size(); }

  std::unique_ptr<Re> alternation() {
    auto first = sequence();
    if (!at('|')) return first;
    auto alt = std::make_unique<Re>(Re{Re::kAlt});
    alt->parts.push_back(std::move(first));
    while (at('|')) {
      ++i_;
      alt->parts.push_back(sequence());
    }
    return alt;
  }

  std::unique_ptr<Re> sequence() {
    auto seq = std::make_unique<Re>(Re{Re::kSeq});
    while (more() && !at('|') && !at(')') && !(at('$') && i_ + 1 == p_.size())) seq->parts.push_back(repeat());
    return seq;
  }

  int number() {
    if (!more() || p_[i_] < '0' || p_[i_] > '9') fail("expected a count");
    int n = 0;
    while (more() && p_[i_] >= '0' && p_[i_] <= '9') {
      n = n * 10 + (p_[i_++] - '0');
      if (n > kMaxRepeat) fail(cat("counts above ", kMaxRepeat, " are not supported"));
    }
    return n;
  }

  std::unique_ptr<Re> repeat() {
    auto atom_re = atom();
    while (more() && (at('*') || at('+') || at('?') || at('{'))) {
      int lo = 0, hi = -1;
      const char q = p_[i_++];
      if (q == '+') lo = 1;
      if (q == '?') hi = 1;
      if (q == '{') {
        lo = number();
        hi = lo;
        if (at(',')) {
          ++i_;
          hi = at('}') ? -1 : number();
        }
        if (!at('}')) fail("expected }");
        ++i_;
        if (hi >= 0 && hi < lo) fail("{n,m} with m < n");
      }
      if (at('?')) ++i_;  // lazy: the same language
      auto r = std::make_unique<Re>(Re{Re::kRepeat});
      r->min = lo;
      r->max = hi;
      r->parts.push_back(std::move(atom_re));
      atom_re = std::move(r);
    }
    return atom_re;
  }

  static void shorthand(char c, std::bitset<128>& set) {
    for (int x = 0; x < 128; ++x) {
      const bool digit = x >= '0' && x <= '9';
      const bool word = digit || (x >= 'a' && x <= 'z') || (x >= 'A' && x <= 'Z') || x == '_';
      const bool space = x == ' ' || (x >= '\t' && x <= '\r');
      if ((c == 'd' && digit) || (c == 'w' && word) || (c == 's' && space)) set.set(static_cast<size_t>(x));
    }
  }

  // An escaped character after '\': a shorthand class into `set` (returns -1) or one ASCII byte.
  int escape(std::bitset<128>& set) {
    if (!more()) fail("a trailing backslash");
    const char c = p_[i_++];
    if (c == 'd' || c == 'w' || c == 's') {
      shorthand(c, set);
      return -1;
    }
    if (c == 'n') return '\n';
    if (c == 't') return '\t';
    if (c == 'r') return '\r';
    if (c == 'f') return '\f';
    if (c == 'v') return '\v';
    if (static_cast<unsigned char>(c) < 0x80 && !std::isalnum(static_cast<unsigned char>(c))) return c;
    --i_;
    fail(cat("the escape \\", c, " is not supported"));
  }

  std::unique_ptr<Re> atom() {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (at('?')) {
        if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') i_ += 2;
        else fail("lookaround and named groups are not supported");
      }
      auto r = alternation();
      if (!at(')')) fail("expected )");
      ++i_;
      return r;
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++i_;
      auto r = std::make_unique<Re>(Re{Re::kClass});
      r->negated = true;  // any character but newline
      r->ascii.set('\n');
      return r;
    }
    if (c == '*' || c == '+' || c == '?' || c == '{' || c == ')') fail("a quantifier or ) with nothing before it");
    auto r = std::make_unique<Re>(Re{Re::kClass});
    if (c == '\\') {
      ++i_;
      const int e = escape(r->ascii);
      if (e >= 0) r->ascii.set(static_cast<size_t>(e));
      return r;
    }
    // One literal character: its UTF-8 bytes.
    const auto lead = static_cast<unsigned char>(c);
    const size_t n = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
    if (i_ + n > p_.size()) fail("a truncated UTF-8 character");
    r->kind = Re::kLiteral;
    r->bytes = std::string(p_.substr(i_, n));
    i_ += n;
    return r;
  }

  std::unique_ptr<Re> char_class() {
    ++i_;
    auto r = std::make_unique<Re>(Re{Re::kClass});
    if (at('^')) {
      r->negated = true;
      ++i_;
    }
    bool first = true;
    while (more() && (!at(']') || first)) {
      first = false;
      int lo;
      if (at('\\')) {
        ++i_;
        lo = escape(r->ascii);
        if (lo < 0) continue;
      } else {
        lo = static_cast<unsigned char>(p_[i_++]);
      }
      int hi = lo;
      if (at('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        if (at('\\')) {
          ++i_;
          std::bitset<128> unused;
          hi = escape(unused);
          if (hi < 0) fail("a class shorthand cannot end a range");
        } else {
          hi = static_cast<unsigned char>(p_[i_++]);
        }
      }
      if (lo >= 0x80 || hi >= 0x80) fail("non-ASCII characters in a class are not supported");
      if (hi < lo) fail("a reversed range");
      for (int x = lo; x <= hi; ++x) r->ascii.set(static_cast<size_t>(x));
    }
    if (!at(']')) fail("expected ]");
    ++i_;
    return r;
  }

  std::string_view p_;
  size_t i_ = 0;
};

// Any UTF-8 character (2-4 bytes, no surrogates or overlongs) from `a` to `z`.
void utf8_multibyte(GrammarBuilder& b, NodeId a, NodeId z) {
  const NodeId c1 = b.node(), c2 = b.node(), c3 = b.node(), e0 = b.node(), ed = b.node(), f0 = b.node(), f4 = b.node();
  b.edge(c1, 0x80, 0xBF, z);
  b.edge(c2, 0x80, 0xBF, c1);
  b.edge(c3, 0x80, 0xBF, c2);
  b.edge(a, 0xC2, 0xDF, c1);
  b.edge(a, 0xE0, 0xE0, e0);
  b.edge(e0, 0xA0, 0xBF, c1);
  b.edge(a, 0xE1, 0xEC, c2);
  b.edge(a, 0xED, 0xED, ed);
  b.edge(ed, 0x80, 0x9F, c1);
  b.edge(a, 0xEE, 0xEF, c2);
  b.edge(a, 0xF0, 0xF0, f0);
  b.edge(f0, 0x90, 0xBF, c2);
  b.edge(a, 0xF1, 0xF3, c3);
  b.edge(a, 0xF4, 0xF4, f4);
  b.edge(f4, 0x80, 0x8F, c2);
}

Frag build(GrammarBuilder& b, const Re& r) {
  switch (r.kind) {
    case Re::kLiteral: return b.literal(r.bytes);
    case Re::kClass: {
      const NodeId a = b.node(), z = b.node();
      for (int x = 0; x < 128; ++x) {
        if (r.ascii.test(static_cast<size_t>(x)) != r.negated) b.edge(a, static_cast<uint8_t>(x), static_cast<uint8_t>(x), z);
      }
      if (r.negated) utf8_multibyte(b, a, z);
      return {a, z};
    }
    case Re::kSeq: {
      std::vector<Frag> parts;
      for (const auto& p : r.parts) parts.push_back(build(b, *p));
      return b.seq(parts);
    }
    case Re::kAlt: {
      std::vector<Frag> options;
      for (const auto& p : r.parts) options.push_back(build(b, *p));
      return b.alt(options);
    }
    case Re::kRepeat: {
      std::vector<Frag> parts;
      for (int k = 0; k < r.min; ++k) parts.push_back(build(b, *r.parts[0]));
      if (r.max < 0) {
        parts.push_back(b.star(build(b, *r.parts[0])));
      } else {
        for (int k = r.min; k < r.max; ++k) parts.push_back(b.opt(build(b, *r.parts[0])));
      }
      return b.seq(parts);
    }
  }
  return b.empty();
}

}  // namespace

Frag regex_fragment(GrammarBuilder& b, std::string_view pattern) {
  const std::unique_ptr<Re> tree = Parser(pattern).parse();
  if (b.size() > 1000000) throw Error("regex: the pattern is too large");
  return build(b, *tree);
}

}  // namespace megadecode::structured
