// How the chat templates turn values into text, with the meaning Python's jinja2 gives them
// (transformers and vLLM render chat templates with it): the `tojson` filter (json.dumps with
// ensure_ascii=False), the `string` filter and `~` (Python's str()), and str.strip/lstrip/rstrip.
// Values are JSON (the request's tools and tool-call arguments), kept in their given key order.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace megadecode::template_values {

using Json = nlohmann::ordered_json;

// json.dumps(v, ensure_ascii=False): ", " and ": " separators, non-ASCII text as is.
std::string to_json(const Json& v);

// str(v): strings as they are, True/False/None, Python's float repr, and Python's repr of
// lists and dicts (['a', 1]). Error for a non-ASCII string inside a list or dict, whose
// repr would need Unicode's printable table.
std::string to_str(const Json& v);

// Python's repr of a float (repr(0.1) == '0.1', repr(1.0) == '1.0', repr(1e-05) == '1e-05').
std::string float_repr(double d);

// Python's str.isspace() for one code point.
bool is_space(char32_t cp);

// Python's str.strip() / lstrip() / rstrip() without arguments (Unicode whitespace). s: UTF-8.
std::string_view strip(std::string_view s);
std::string_view lstrip(std::string_view s);
std::string_view rstrip(std::string_view s);

// Python's str.strip(chars) family for ASCII `chars` (the templates strip "\n").
std::string_view strip_chars(std::string_view s, std::string_view chars);
std::string_view lstrip_chars(std::string_view s, std::string_view chars);
std::string_view rstrip_chars(std::string_view s, std::string_view chars);

}  // namespace megadecode::template_values
