// A grammar as a recursive transition network over bytes: every rule is a small byte automaton
// whose edges read a byte range, call another rule (push a return node) or move for free
// (epsilon). The schema compiler (schema.h) builds one; the matcher (matcher.h) runs it as a
// pushdown automaton whose stack holds grammar nodes.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace megadecode::structured {

using NodeId = int32_t;

struct ByteEdge {
  uint8_t lo, hi;  // inclusive byte range
  NodeId to;
};
struct CallEdge {
  NodeId rule;  // the callee's start node
  NodeId ret;   // where the caller goes on once the callee ends
};

struct GrammarNode {
  std::vector<ByteEdge> bytes;
  std::vector<CallEdge> calls;
  std::vector<NodeId> eps;
  bool final = false;  // the node's rule may end (return to its caller) here
  // The start of a JSON string's next character, when the string's closing quote ends the node's
  // rule: at least string_need more characters before the quote, at most string_room (-1: none).
  // The matcher takes this node's token set from Vocabulary::strings() instead of a trie walk.
  bool string_char = false;
  int32_t string_need = 0, string_room = -1;
};

struct Grammar {
  std::vector<GrammarNode> nodes;
  NodeId root = 0;  // start node of the top rule
};

// A piece of a rule under construction: enter at `begin`, leave at `end`.
struct Frag {
  NodeId begin, end;
};

class GrammarBuilder {
 public:
  NodeId node();
  Frag empty();
  Frag literal(std::string_view bytes);
  Frag byte_range(uint8_t lo, uint8_t hi);
  Frag byte_ranges(std::initializer_list<std::pair<uint8_t, uint8_t>> ranges);
  Frag seq(std::initializer_list<Frag> parts);
  Frag seq(const std::vector<Frag>& parts);
  Frag alt(const std::vector<Frag>& options);
  Frag opt(Frag f);
  Frag star(Frag f);      // zero or more
  Frag call(NodeId rule);  // one call of a rule (its start node from rule())

  // A rule's start node, before its body exists (so that a body may call itself).
  NodeId rule();
  void define(NodeId rule, Frag body);

  void mark_string_char(NodeId n, int32_t need, int32_t room) {
    g_.nodes[n].string_char = true;
    g_.nodes[n].string_need = need;
    g_.nodes[n].string_room = room;
  }
  void eps(NodeId from, NodeId to) { g_.nodes[from].eps.push_back(to); }
  void edge(NodeId from, uint8_t lo, uint8_t hi, NodeId to) { g_.nodes[from].bytes.push_back({lo, hi, to}); }
  size_t size() const { return g_.nodes.size(); }
  Grammar finish(NodeId root_rule);

 private:
  Grammar g_;
};

}  // namespace megadecode::structured
