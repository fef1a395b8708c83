// Runs a Grammar against a Vocabulary: a pushdown automaton whose states (sets of stacks of
// grammar nodes) are interned and whose byte transitions are memoised, so a walk of the token
// trie costs an array lookup per trie node. A stack is interned too, as its top frame (a node and
// the stack below it), so stacks share their lower frames, a state is a sorted list of stack ids,
// and a transition not yet memoised costs a few hash lookups, not copies of whole stacks.
//
// Token masks are split the way the grammar is: for each node that reads bytes, the tokens it
// accepts on its own (without returning to its caller) are computed once by a trie walk and kept
// (the "local set"), together with the trie nodes where the node's rule may return with bytes of
// the token still to come (the "exits"). A mask is then the union of the local sets of the
// state's stack tops plus, at each exit, a walk of that trie subtree against the real caller
// stack. A string's body, a number or whitespace share their local sets across every place they
// appear; a string's next character takes its set from the vocabulary's per-count string masks
// (vocab.h) instead of a walk. The exits' walks are done once per state and their tokens kept
// with it (a short list), so a mask made again is the local sets' union and that list; the last
// kCachedMasks masks are kept whole by state.
//
// Limits: a stack deeper than kMaxStackDepth ends its path (a state left with no way on allows the
// end tokens, as TokenConstraint requires); the state memo only grows (Compiler replaces a grammar
// whose memo outgrew its bound).
//
// Thread-safety: a CompiledGrammar is shared by every sequence that uses the same spec; its memo
// tables are guarded by one mutex, so matchers on different threads may share it.
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/token_constraint.h"
#include "structured/grammar.h"
#include "structured/vocab.h"

namespace megadecode::structured {

using StateId = int32_t;
constexpr StateId kDead = 0;
using StackId = int32_t;  // an interned stack (CompiledGrammar::Frame)
constexpr StackId kEmptyStack = -1;
constexpr int kMaxStackDepth = 256;  // deeper nesting ends the path (JSON nested ~250 deep)

class CompiledGrammar {
 public:
  CompiledGrammar(Grammar grammar, std::shared_ptr<const Vocabulary> vocab);

  const Vocabulary& vocab() const { return *vocab_; }
  size_t n_nodes() const { return grammar_.nodes.size(); }
  StateId start() const { return start_; }

  // The matcher's primitives (each takes the lock).
  StateId advance_bytes(StateId s, std::string_view bytes);
  bool accepting(StateId s);
  bool finished(StateId s);  // accepting and nothing more may follow
  void fill_mask(StateId s, std::span<uint32_t> words);

  // Memo sizes, for the benchmark and tests.
  size_t n_states();
  size_t n_local_sets();

 private:
  // A stack: its top node and the stack below it (kEmptyStack at the bottom).
  struct Frame {
    NodeId node;
    StackId below;
    int32_t depth;  // frames, this one included
  };
  struct State {
    std::vector<StackId> stacks;  // sorted; each top reads bytes
    bool accepting = false;
    std::vector<StateId> continuation;  // per stack: the stack without its top, closed (-1: not yet)
    // The tokens the walks from the tops' exits reach (make_mask's second part), sorted and
    // unique: walked once per state, so a mask made again costs the set unions only.
    bool exits_walked = false;
    std::vector<int32_t> exit_tokens;
  };
  struct LocalSet {
    bool ready = false;
    bool dense = false;
    std::vector<uint32_t> words;    // dense: a token mask
    std::vector<int32_t> tokens;    // sparse: token ids
    std::vector<int32_t> exits;     // trie nodes with children where the rule may return
  };

  StateId intern(std::vector<StackId> stacks, bool accepting);
  StackId push(StackId below, NodeId node);
  struct LocalClosure {
    bool ready = false;
    bool pops = false;
    std::vector<std::vector<NodeId>> stacks;  // bottom to top, relative to the node's frame
  };
  const LocalClosure& local_closure(NodeId n);
  void close(StackId below, NodeId top, std::vector<StackId>& out, bool& accepting);
  StateId step(StateId s, uint8_t byte);
  StateId compute_step(StateId s, uint8_t byte);
  StateId continuation(StateId s, size_t stack_index);
  void make_mask(StateId s, std::span<uint32_t> words);
  const LocalSet& local_set(NodeId top);
  void string_set(const GrammarNode& node, LocalSet& ls);
  // Walks the children of trie node `from` starting in state `s`; fn(trie node, state) per live node.
  template <typename Fn>
  void walk(int32_t from, StateId s, Fn&& fn);

  Grammar grammar_;
  std::shared_ptr<const Vocabulary> vocab_;
  std::mutex mu_;
  std::vector<State> states_;
  std::vector<std::array<StateId, 256>> next_;  // per state: -1 unknown
  struct KeyHash {
    size_t operator()(const std::vector<StackId>& key) const;
  };
  std::vector<Frame> frames_;
  std::unordered_map<uint64_t, StackId> frame_index_;  // (node, below) -> its stack
  std::unordered_map<std::vector<StackId>, StateId, KeyHash> index_;  // accepting, then the stacks
  std::vector<StackId> key_;  // intern's scratch key
  std::vector<LocalSet> local_;  // per grammar node
  std::vector<LocalClosure> closures_;  // per grammar node
  std::vector<StateId> walk_states_;
  // The last masks made, by state (a string's body or a value's end repeats step after step).
  static constexpr size_t kCachedMasks = 64;
  std::vector<std::pair<StateId, std::vector<uint32_t>>> mask_cache_;
  size_t mask_cache_next_ = 0;
  StateId start_ = kDead;
};

// A sequence's constraint: one CompiledGrammar and the state reached so far.
class GrammarConstraint final : public TokenConstraint {
 public:
  explicit GrammarConstraint(std::shared_ptr<CompiledGrammar> grammar);
  void fill_mask(std::span<uint32_t> words) const override;
  bool accept(int32_t token) override;
  bool accepting() const override;
  bool finished() const override;

 private:
  std::shared_ptr<CompiledGrammar> grammar_;
  StateId state_;
  bool ended_ = false;  // an end token was accepted
};

}  // namespace megadecode::structured
