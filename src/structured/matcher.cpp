// The pushdown matcher: closure over epsilon, call and return edges; interned states with
// memoised byte transitions; local token sets per byte-reading node; masks.
#include "structured/matcher.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/check.h"

namespace megadecode::structured {
namespace {

void set_token(std::span<uint32_t> words, int32_t id) { words[id >> 5] |= 1u << (id & 31); }

}  // namespace

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const Vocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), local_(grammar_.nodes.size()), closures_(grammar_.nodes.size()) {
  walk_states_.resize(static_cast<size_t>(vocab_->max_depth()) + 2);
  const std::lock_guard lock(mu_);
  MD_CHECK(intern({}, false) == kDead);
  std::vector<StackId> stacks;
  bool accepting = false;
  close(kEmptyStack, grammar_.root, stacks, accepting);
  start_ = intern(std::move(stacks), accepting);
}

size_t CompiledGrammar::KeyHash::operator()(const std::vector<StackId>& key) const {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ key.size();
  for (const StackId id : key) h = (h ^ static_cast<uint32_t>(id)) * 0x100000001b3ull;
  return static_cast<size_t>(h ^ (h >> 29));
}

StackId CompiledGrammar::push(StackId below, NodeId node) {
  const uint64_t key = static_cast<uint64_t>(static_cast<uint32_t>(node)) << 32 | static_cast<uint32_t>(below);
  const auto [it, inserted] = frame_index_.try_emplace(key, static_cast<StackId>(frames_.size()));
  if (inserted) frames_.push_back({node, below, below == kEmptyStack ? 1 : frames_[below].depth + 1});
  return it->second;
}

// The closure of the one-frame stack [n]: every stack (relative to n's frame) whose top reads
// bytes, reached over epsilon, call and return edges without leaving n's rule; `pops` when n's
// rule can end. Computed once per node.
const CompiledGrammar::LocalClosure& CompiledGrammar::local_closure(NodeId n) {
  LocalClosure& lc = closures_[n];
  if (lc.ready) return lc;
  std::vector<std::vector<NodeId>> work = {{n}};
  std::vector<std::vector<NodeId>> seen;  // closures are small: a list beats hashing
  while (!work.empty()) {
    std::vector<NodeId> st = std::move(work.back());
    work.pop_back();
    if (std::find(seen.begin(), seen.end(), st) != seen.end()) continue;
    seen.push_back(st);
    const GrammarNode& node = grammar_.nodes[st.back()];
    for (const NodeId e : node.eps) {
      std::vector<NodeId> next = st;
      next.back() = e;
      work.push_back(std::move(next));
    }
    if (st.size() < static_cast<size_t>(kMaxStackDepth)) {
      for (const CallEdge& c : node.calls) {
        std::vector<NodeId> next = st;
        next.back() = c.ret;
        next.push_back(c.rule);
        work.push_back(std::move(next));
      }
    }
    if (node.final) {
      if (st.size() == 1) {
        lc.pops = true;
      } else {
        work.emplace_back(st.begin(), st.end() - 1);
      }
    }
    if (!node.bytes.empty()) lc.stacks.push_back(std::move(st));
  }
  lc.ready = true;
  return lc;
}

// Follows epsilon, call and return edges from the stack `below` + [top]; collects every stack
// whose top reads bytes, and sets `accepting` when the bottom rule can end. closure(rest + [n]) is
// rest + each stack of [n]'s closure, and closure(rest) again when n's rule can end.
void CompiledGrammar::close(StackId below, NodeId top, std::vector<StackId>& out, bool& accepting) {
  for (;;) {
    const int32_t depth = below == kEmptyStack ? 0 : frames_[below].depth;
    const LocalClosure& lc = local_closure(top);  // (closures_ never grows)
    for (const std::vector<NodeId>& l : lc.stacks) {
      if (depth + l.size() > static_cast<size_t>(kMaxStackDepth)) continue;
      StackId st = below;
      for (const NodeId n : l) st = push(st, n);
      out.push_back(st);
    }
    if (!lc.pops) return;
    if (below == kEmptyStack) break;
    top = frames_[below].node;
    below = frames_[below].below;
  }
  accepting = true;
}

StateId CompiledGrammar::intern(std::vector<StackId> stacks, bool accepting) {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  key_.assign(1, accepting ? 1 : 0);
  key_.insert(key_.end(), stacks.begin(), stacks.end());
  if (const auto it = index_.find(key_); it != index_.end()) return it->second;
  const StateId id = static_cast<StateId>(states_.size());
  index_.emplace(key_, id);
  State s;
  s.continuation.assign(stacks.size(), -1);
  s.stacks = std::move(stacks);
  s.accepting = accepting;
  // Bytes no top reads lead nowhere: known now, so walks never miss on them.
  std::array<StateId, 256> row;
  row.fill(kDead);
  for (const StackId st : s.stacks)
    for (const ByteEdge& e : grammar_.nodes[frames_[st].node].bytes) std::fill(row.begin() + e.lo, row.begin() + e.hi + 1, -1);
  states_.push_back(std::move(s));
  next_.push_back(row);
  return id;
}

inline StateId CompiledGrammar::step(StateId s, uint8_t byte) {
  const StateId t = next_[s][byte];
  return t >= 0 ? t : compute_step(s, byte);
}

StateId CompiledGrammar::compute_step(StateId s, uint8_t byte) {
  std::vector<StackId> out;
  bool accepting = false;
  for (const StackId st : states_[s].stacks) {  // (close() leaves states_ alone; intern() comes after)
    const Frame f = frames_[st];  // (a copy: close() may grow frames_)
    for (const ByteEdge& e : grammar_.nodes[f.node].bytes) {
      if (byte < e.lo || byte > e.hi) continue;
      close(f.below, e.to, out, accepting);
    }
  }
  const StateId t = out.empty() && !accepting ? kDead : intern(std::move(out), accepting);
  next_[s][byte] = t;
  return t;
}

StateId CompiledGrammar::continuation(StateId s, size_t stack_index) {
  StateId c = states_[s].continuation[stack_index];
  if (c >= 0) return c;
  const StackId rest = frames_[states_[s].stacks[stack_index]].below;
  std::vector<StackId> out;
  bool accepting = rest == kEmptyStack;  // the closure of the empty stack accepts
  if (rest != kEmptyStack) close(frames_[rest].below, frames_[rest].node, out, accepting);
  c = out.empty() && !accepting ? kDead : intern(std::move(out), accepting);
  states_[s].continuation[stack_index] = c;
  return c;
}

template <typename Fn>
void CompiledGrammar::walk(int32_t from, StateId s, Fn&& fn) {
  const std::span<const TrieNode> trie = vocab_->trie();
  const int base = trie[from].depth;
  walk_states_[0] = s;
  for (int32_t i = from + 1, end = trie[from].subtree_end; i < end;) {
    const TrieNode& n = trie[i];
    const int d = n.depth - base;
    const StateId t = step(walk_states_[d - 1], n.byte);
    if (t == kDead) {
      i = n.subtree_end;
      continue;
    }
    walk_states_[d] = t;
    fn(i, t);
    ++i;
  }
}

const CompiledGrammar::LocalSet& CompiledGrammar::local_set(NodeId top) {
  LocalSet& ls = local_[top];
  if (ls.ready) return ls;
  const GrammarNode& node = grammar_.nodes[top];
  if (node.string_char) {
    string_set(node, ls);
    return ls;
  }
  const std::span<const TrieNode> trie = vocab_->trie();
  const std::span<const int32_t> tokens = vocab_->trie_tokens();
  const StateId s0 = intern({push(kEmptyStack, top)}, false);
  walk(0, s0, [&](int32_t i, StateId t) {
    const TrieNode& n = trie[i];
    for (int32_t k = n.tok_begin; k < n.tok_end; ++k) ls.tokens.push_back(tokens[k]);
    if (states_[t].accepting && n.subtree_end > i + 1) ls.exits.push_back(i);
  });
  const size_t n_words = token_mask_words(vocab_->size());
  if (ls.tokens.size() > n_words) {
    ls.dense = true;
    ls.words.assign(n_words, 0);
    for (const int32_t id : ls.tokens) set_token(ls.words, id);
    ls.tokens.clear();
    ls.tokens.shrink_to_fit();
  }
  ls.ready = true;
  return ls;
}

// A string's next character (GrammarNode::string_char): the tokens that stay inside the string
// within the room left, those that close it after `need` to `room` characters and end at the
// quote, and the exits just past such a quote. Equal to the trie walk's result (the string's
// closing quote ends the rule), from masks made once per vocabulary.
void CompiledGrammar::string_set(const GrammarNode& node, LocalSet& ls) {
  const StringTable& t = vocab_->strings();
  const size_t n_words = token_mask_words(vocab_->size());
  const size_t room = node.string_room < 0 ? SIZE_MAX : static_cast<size_t>(node.string_room);
  const size_t need = static_cast<size_t>(std::max(node.string_need, 1));
  ls.dense = true;
  ls.words = t.inside_upto[std::min(room, t.inside_upto.size() - 1)];
  const size_t hi = std::min(room, t.closing_upto.size() - 1), lo = std::min(need - 1, t.closing_upto.size() - 1);
  if (hi > lo) {
    const std::vector<uint32_t>& a = t.closing_upto[hi];
    const std::vector<uint32_t>& b = t.closing_upto[lo];
    for (size_t w = 0; w < n_words; ++w) ls.words[w] |= a[w] & ~b[w];
  }
  for (size_t c = need; c < t.exits.size() && c <= room; ++c) ls.exits.insert(ls.exits.end(), t.exits[c].begin(), t.exits[c].end());
  ls.ready = true;
}

StateId CompiledGrammar::advance_bytes(StateId s, std::string_view bytes) {
  const std::lock_guard lock(mu_);
  for (const char c : bytes) {
    s = step(s, static_cast<uint8_t>(c));
    if (s == kDead) break;
  }
  return s;
}

bool CompiledGrammar::accepting(StateId s) {
  const std::lock_guard lock(mu_);
  return states_[s].accepting;
}

bool CompiledGrammar::finished(StateId s) {
  const std::lock_guard lock(mu_);
  return states_[s].accepting && states_[s].stacks.empty();
}

void CompiledGrammar::fill_mask(StateId s, std::span<uint32_t> words) {
  const std::lock_guard lock(mu_);
  const size_t n_words = token_mask_words(vocab_->size());
  MD_CHECK(words.size() >= n_words, "token mask of ", words.size(), " words for a vocabulary of ", vocab_->size());
  std::fill(words.begin() + static_cast<ptrdiff_t>(n_words), words.end(), 0u);
  for (const auto& [state, mask] : mask_cache_) {
    if (state == s) {
      std::copy(mask.begin(), mask.end(), words.begin());
      return;
    }
  }
  make_mask(s, words.first(n_words));
  if (mask_cache_.size() < kCachedMasks) {
    mask_cache_.emplace_back(s, std::vector<uint32_t>(words.begin(), words.begin() + static_cast<ptrdiff_t>(n_words)));
  } else {
    auto& [state, mask] = mask_cache_[mask_cache_next_];
    state = s;
    std::copy(words.begin(), words.begin() + static_cast<ptrdiff_t>(n_words), mask.begin());
    mask_cache_next_ = (mask_cache_next_ + 1) % kCachedMasks;
  }
}

// The mask of state s (the lock held): the union over its stacks of each top's local set and the
// walks from that set's exits with the stack's continuation (walked on the state's first mask).
void CompiledGrammar::make_mask(StateId s, std::span<uint32_t> words) {
  const size_t n_words = words.size();
  std::fill(words.begin(), words.end(), 0u);
  const size_t n_stacks = states_[s].stacks.size();
  std::vector<NodeId> tops_done;
  for (size_t i = 0; i < n_stacks; ++i) {
    const NodeId top = frames_[states_[s].stacks[i]].node;
    if (std::find(tops_done.begin(), tops_done.end(), top) != tops_done.end()) continue;
    tops_done.push_back(top);
    const LocalSet& ls = local_set(top);
    if (ls.dense) {
      for (size_t w = 0; w < n_words; ++w) words[w] |= ls.words[w];
    } else {
      for (const int32_t id : ls.tokens) set_token(words, id);
    }
  }
  if (!states_[s].exits_walked) {
    // Walks intern states (states_ may grow): index it again after each.
    const std::span<const TrieNode> trie = vocab_->trie();
    const std::span<const int32_t> tokens = vocab_->trie_tokens();
    std::vector<int32_t> reached;
    for (size_t i = 0; i < n_stacks; ++i) {
      const Frame f = frames_[states_[s].stacks[i]];
      if (f.depth <= 1) continue;
      const LocalSet& ls = local_set(f.node);  // local_ never grows
      if (ls.exits.empty()) continue;
      const StateId c = continuation(s, i);
      if (c == kDead) continue;
      for (const int32_t e : ls.exits) {
        walk(e, c, [&](int32_t node, StateId) {
          for (int32_t k = trie[node].tok_begin; k < trie[node].tok_end; ++k) reached.push_back(tokens[k]);
        });
      }
    }
    std::sort(reached.begin(), reached.end());
    reached.erase(std::unique(reached.begin(), reached.end()), reached.end());
    reached.shrink_to_fit();
    states_[s].exit_tokens = std::move(reached);
    states_[s].exits_walked = true;
  }
  for (const int32_t id : states_[s].exit_tokens) set_token(words, id);
  bool any = false;
  for (size_t w = 0; w < n_words && !any; ++w) any = words[w] != 0;
  if (states_[s].accepting || !any)
    for (const int32_t id : vocab_->end_ids()) set_token(words, id);
}

size_t CompiledGrammar::n_states() {
  const std::lock_guard lock(mu_);
  return states_.size();
}

size_t CompiledGrammar::n_local_sets() {
  const std::lock_guard lock(mu_);
  return static_cast<size_t>(std::count_if(local_.begin(), local_.end(), [](const LocalSet& l) { return l.ready; }));
}

GrammarConstraint::GrammarConstraint(std::shared_ptr<CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), state_(grammar_->start()) {}

void GrammarConstraint::fill_mask(std::span<uint32_t> words) const {
  if (ended_) {
    std::fill(words.begin(), words.end(), 0u);
    for (const int32_t id : grammar_->vocab().end_ids()) set_token(words, id);
    return;
  }
  grammar_->fill_mask(state_, words);
}

bool GrammarConstraint::accept(int32_t token) {
  const Vocabulary& vocab = grammar_->vocab();
  if (ended_ || token < 0 || token >= vocab.size()) return false;
  if (vocab.is_end(token)) {
    if (!grammar_->accepting(state_)) {  // allowed only where no other token is (fill_mask)
      std::vector<uint32_t> words(token_mask_words(vocab.size()));
      grammar_->fill_mask(state_, words);
      if ((words[token >> 5] >> (token & 31) & 1u) == 0) return false;
    }
    ended_ = true;
    return true;
  }
  if (!vocab.is_text(token) || vocab.bytes(token).empty()) return false;
  const StateId next = grammar_->advance_bytes(state_, vocab.bytes(token));
  if (next == kDead) return false;
  state_ = next;
  return true;
}

bool GrammarConstraint::accepting() const { return !ended_ && grammar_->accepting(state_); }

bool GrammarConstraint::finished() const { return ended_ || grammar_->finished(state_); }

}  // namespace megadecode::structured
