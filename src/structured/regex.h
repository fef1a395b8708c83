// A regular-expression subset compiled to a grammar fragment (vLLM's `regex` structured output):
// the whole output matches the pattern. Supported: literal characters (UTF-8 too), `.` (any
// character but newline), classes `[a-z0-9_]` and `[^...]` of ASCII characters, `\d \w \s`,
// escaped metacharacters and `\n \t \r`, groups `( )` and `(?: )`, `|`, and the quantifiers
// `* + ? {n} {n,} {n,m}` (a lazy `?` after one is ignored), `^` at the start and `$` at the end.
// Anything else (backreferences, lookaround, `\b`, `\D \W \S`, non-ASCII in classes) is an Error
// naming the offset.
#pragma once

#include <string_view>

#include "structured/grammar.h"

namespace megadecode::structured {

Frag regex_fragment(GrammarBuilder& b, std::string_view pattern);

}  // namespace megadecode::structured
