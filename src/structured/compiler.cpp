// The compile cache: by Spec::cache_key(); when full, the whole cache is dropped (grammars in use
// stay alive through their constraints).
#include "structured/compiler.h"

namespace megadecode::structured {

Compiler::Compiler(Vocabulary vocab, size_t max_cached)
    : Compiler(std::make_shared<const Vocabulary>(std::move(vocab)), max_cached) {}

Compiler::Compiler(std::shared_ptr<const Vocabulary> vocab, size_t max_cached)
    : vocab_(std::move(vocab)), max_cached_(max_cached) {}

std::shared_ptr<CompiledGrammar> Compiler::compile(const Spec& spec) {
  const std::string key = spec.cache_key();
  {
    const std::lock_guard lock(mu_);
    const auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
  }
  auto grammar = std::make_shared<CompiledGrammar>(build_grammar(spec), vocab_);
  const std::lock_guard lock(mu_);
  if (cache_.size() >= max_cached_) cache_.clear();
  return cache_.try_emplace(key, std::move(grammar)).first->second;
}

std::shared_ptr<TokenConstraint> Compiler::make(const Spec& spec) {
  return std::make_shared<GrammarConstraint>(compile(spec));
}

size_t Compiler::n_cached() {
  const std::lock_guard lock(mu_);
  return cache_.size();
}

}  // namespace megadecode::structured
