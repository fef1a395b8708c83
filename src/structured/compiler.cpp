// The compile cache: by Spec::cache_key(); when full, the whole cache is dropped, and a grammar
// whose memo outgrew max_states is replaced (grammars in use stay alive through their constraints).
#include "structured/compiler.h"

namespace megadecode::structured {

Compiler::Compiler(Vocabulary vocab, size_t max_cached, size_t max_states)
    : Compiler(std::make_shared<const Vocabulary>(std::move(vocab)), max_cached, max_states) {}

Compiler::Compiler(std::shared_ptr<const Vocabulary> vocab, size_t max_cached, size_t max_states)
    : vocab_(std::move(vocab)), max_cached_(max_cached), max_states_(max_states) {}

std::shared_ptr<CompiledGrammar> Compiler::compile(const Spec& spec) {
  const std::string key = spec.cache_key();
  {
    const std::lock_guard lock(mu_);
    const auto it = cache_.find(key);
    if (it != cache_.end()) {
      if (it->second->n_states() <= max_states_) return it->second;
      cache_.erase(it);  // grown too large: a fresh one for new sequences
    }
  }
  auto grammar = std::make_shared<CompiledGrammar>(build_grammar(spec), vocab_);
  const std::lock_guard lock(mu_);
  if (cache_.size() >= max_cached_) cache_.clear();
  return cache_.insert_or_assign(key, std::move(grammar)).first->second;
}

std::shared_ptr<TokenConstraint> Compiler::make(const Spec& spec) {
  return std::make_shared<GrammarConstraint>(compile(spec));
}

size_t Compiler::n_cached() {
  const std::lock_guard lock(mu_);
  return cache_.size();
}

}  // namespace megadecode::structured
