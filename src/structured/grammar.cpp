// The grammar builder: fragments joined by epsilon edges (Thompson-style construction).
#include "structured/grammar.h"

namespace megadecode::structured {

NodeId GrammarBuilder::node() {
  g_.nodes.emplace_back();
  return static_cast<NodeId>(g_.nodes.size() - 1);
}

Frag GrammarBuilder::empty() {
  const NodeId n = node();
  return {n, n};
}

Frag GrammarBuilder::literal(std::string_view bytes) {
  const NodeId begin = node();
  NodeId at = begin;
  for (const char c : bytes) {
    const NodeId next = node();
    edge(at, static_cast<uint8_t>(c), static_cast<uint8_t>(c), next);
    at = next;
  }
  return {begin, at};
}

Frag GrammarBuilder::byte_range(uint8_t lo, uint8_t hi) {
  const NodeId a = node(), b = node();
  edge(a, lo, hi, b);
  return {a, b};
}

Frag GrammarBuilder::byte_ranges(std::initializer_list<std::pair<uint8_t, uint8_t>> ranges) {
  const NodeId a = node(), b = node();
  for (const auto& [lo, hi] : ranges) edge(a, lo, hi, b);
  return {a, b};
}

Frag GrammarBuilder::seq(std::initializer_list<Frag> parts) { return seq(std::vector<Frag>(parts)); }

Frag GrammarBuilder::seq(const std::vector<Frag>& parts) {
  if (parts.empty()) return empty();
  for (size_t i = 1; i < parts.size(); ++i) eps(parts[i - 1].end, parts[i].begin);
  return {parts.front().begin, parts.back().end};
}

Frag GrammarBuilder::alt(const std::vector<Frag>& options) {
  if (options.size() == 1) return options[0];
  const NodeId a = node(), b = node();
  for (const Frag& f : options) {
    eps(a, f.begin);
    eps(f.end, b);
  }
  return {a, b};
}

Frag GrammarBuilder::opt(Frag f) {
  const NodeId a = node(), b = node();
  eps(a, f.begin);
  eps(a, b);
  eps(f.end, b);
  return {a, b};
}

Frag GrammarBuilder::star(Frag f) {
  const NodeId a = node();
  eps(a, f.begin);
  eps(f.end, a);
  return {a, a};
}

Frag GrammarBuilder::call(NodeId rule) {
  const NodeId a = node(), b = node();
  g_.nodes[a].calls.push_back({rule, b});
  return {a, b};
}

NodeId GrammarBuilder::rule() { return node(); }

void GrammarBuilder::define(NodeId rule, Frag body) {
  eps(rule, body.begin);
  g_.nodes[body.end].final = true;
}

Grammar GrammarBuilder::finish(NodeId root_rule) {
  g_.root = root_rule;
  return std::move(g_);
}

}  // namespace megadecode::structured
