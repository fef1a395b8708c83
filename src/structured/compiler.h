// The structured-output front door for the server: one Compiler per loaded tokenizer turns a
// Spec into a per-sequence TokenConstraint, caching compiled grammars by spec (the grammar's
// token sets fill in as sequences use it, and every later sequence with the same spec shares them).
//
//   structured::Compiler compiler(structured::Vocabulary::from_tokenizer(tok, {eos_id}));
//   std::shared_ptr<TokenConstraint> c = compiler.make(structured::Spec::json_schema(text));
//   // with a reasoning model: structured::after_reasoning(c, end_of_reasoning_ids, vocab size)
//
// compile() and make() throw SchemaError (a 400: keyword and pointer) or Error (bad choice list).
// Thread-safety: any thread may call compile() and make().
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "engine/token_constraint.h"
#include "structured/matcher.h"
#include "structured/schema.h"
#include "structured/vocab.h"

namespace megadecode::structured {

class Compiler {
 public:
  // max_cached: grammars kept by spec (when full the cache starts over); max_states: a cached
  // grammar whose memo has grown past this many states (about 1 KiB each: stacks share frames) is
  // compiled afresh for the next request, which bounds a hot grammar's memory (JSON mode over
  // deeply nested outputs keeps making states); sequences holding the old one keep it.
  explicit Compiler(Vocabulary vocab, size_t max_cached = 256, size_t max_states = 1 << 15);
  explicit Compiler(std::shared_ptr<const Vocabulary> vocab, size_t max_cached = 256, size_t max_states = 1 << 15);

  std::shared_ptr<CompiledGrammar> compile(const Spec& spec);
  std::shared_ptr<TokenConstraint> make(const Spec& spec);

  const Vocabulary& vocab() const { return *vocab_; }
  size_t n_cached();

 private:
  std::shared_ptr<const Vocabulary> vocab_;
  size_t max_cached_, max_states_;
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<CompiledGrammar>> cache_;
};

}  // namespace megadecode::structured
