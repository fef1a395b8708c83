// Structured output as a generation request asks for it (the grammar engine is src/structured/):
//   response_format  {"type": "text"} (none), {"type": "json_object"}, or {"type": "json_schema",
//                    "json_schema": {"name", "schema", "strict", "description"}} (OpenAI's form);
//   structured_outputs  vLLM's: exactly one of "json" (a schema, as an object or its JSON text),
//                    "regex", "choice" (a list of strings) or "json_object": true; "grammar" and
//                    "structural_tag" are refused by name;
//   guided_json, guided_regex, guided_choice  vLLM's older top-level names of the same three.
// At most one of the three forms. Every malformed field is an ApiError 400 naming it; a schema the
// engine cannot enforce is refused when it is compiled (openai_service.cpp: keyword and pointer).
#pragma once

#include <optional>
#include <string>

#include "server/request_json.h"
#include "structured/schema.h"

namespace megadecode {

struct StructuredOutput {
  structured::Spec spec;
  std::string field;  // the request field that asked for it ("response_format", "structured_outputs", ...)
};

// The request's structured output, if it asks for any.
std::optional<StructuredOutput> parse_structured_output(const RequestJson& body);

}  // namespace megadecode
