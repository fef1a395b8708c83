// Qwen3-Coder's tool call as grammar, for a forced call held to its tools' parameter schemas. After
// the prompt's "<tool_call>\n" the output is one of
//
//   <function=NAME>\n(<parameter=P>\nVALUE\n</parameter>\n)*</function>\n
//
// the parameters in the schema's order, each required one present, none other. A VALUE is what the
// server's parser (server/tool_call_formats.h, as vLLM's qwen3_coder parser) types by the
// parameter's declared "type" (a list's first non-null one): for "string", the raw text (valid
// UTF-8, no control bytes but tab, newline and CR, never "</parameter>" or "</tool_call>") or one
// of its enum/const strings; for "null", null; for every other type, JSON text under the
// parameter's whole schema. Refused (SchemaError, keyword and pointer): parameters that are not
// one object schema of properties (a root $ref, anyOf, oneOf or another type), a parameter typed by
// no "type" (its text would be read as a string) unless it allows any string, string length and
// format on a text parameter, and a parameter name the parser cannot read back ('<', '>', a line
// break, blanks at either end).
#pragma once

#include "structured/grammar.h"
#include "structured/schema_compiler.h"

namespace megadecode::structured {

// tools: [{"name": ..., "parameters": ...}, ...] (Spec::xml_call), the compiler's root.
Frag xml_call(SchemaCompiler& compiler, GrammarBuilder& b, const Json& tools);

}  // namespace megadecode::structured
