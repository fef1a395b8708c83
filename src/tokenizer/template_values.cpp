// Python semantics of template values (see template_values.h).
#include "tokenizer/template_values.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/check.h"
#include "tokenizer/utf8.h"

namespace megadecode::template_values {
namespace {

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// repr() of a str: single quotes unless the text holds ' and no ", escapes as Python writes them.
void append_repr_string(std::string& out, std::string_view s) {
  const bool double_quotes = s.find('\'') != std::string_view::npos && s.find('"') == std::string_view::npos;
  const char quote = double_quotes ? '"' : '\'';
  out += quote;
  for (const char c : s) {
    const auto b = static_cast<unsigned char>(c);
    MD_REQUIRE(b < 0x80, "chat template: cannot render the non-ASCII string '", s,
               "' inside a list or object with the string filter");
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (b < 0x20 || b == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", b);
      out += buf;
    } else {
      out += c;
    }
  }
  out += quote;
}

void append_number(std::string& out, const Json& v) {
  if (v.is_number_integer()) {
    out += v.is_number_unsigned() ? std::to_string(v.get<uint64_t>()) : std::to_string(v.get<int64_t>());
  } else {
    out += float_repr(v.get<double>());
  }
}

// json.dumps (kJson) and Python's repr (kRepr) share their layout: ", " between items, ": "
// after keys; they differ in the scalars' spelling and the strings' quoting.
enum class Style { kJson, kRepr };

void append_string(std::string& out, std::string_view s, Style style) {
  if (style == Style::kJson) {
    append_json_string(out, s);
  } else {
    append_repr_string(out, s);
  }
}

void append_value(std::string& out, const Json& v, Style style) {
  const bool json = style == Style::kJson;
  switch (v.type()) {
    case Json::value_t::null: out += json ? "null" : "None"; break;
    case Json::value_t::boolean: out += v.get<bool>() ? (json ? "true" : "True") : (json ? "false" : "False"); break;
    case Json::value_t::string: append_string(out, v.get_ref<const std::string&>(), style); break;
    case Json::value_t::array: {
      out += '[';
      bool first = true;
      for (const Json& x : v) {
        if (!first) out += ", ";
        first = false;
        append_value(out, x, style);
      }
      out += ']';
      break;
    }
    case Json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, x] : v.items()) {
        if (!first) out += ", ";
        first = false;
        append_string(out, key, style);
        out += ": ";
        append_value(out, x, style);
      }
      out += '}';
      break;
    }
    default: append_number(out, v);
  }
}

// Length of the UTF-8 character that ends at s[end - 1].
size_t last_char_length(std::string_view s, size_t end) {
  size_t n = 1;
  while (n < 4 && n < end && (static_cast<unsigned char>(s[end - n]) & 0xC0) == 0x80) ++n;
  return n;
}

bool in(char c, std::string_view chars) { return chars.find(c) != std::string_view::npos; }

}  // namespace

std::string to_json(const Json& v) {
  std::string out;
  append_value(out, v, Style::kJson);
  return out;
}

std::string to_str(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  std::string out;
  append_value(out, v, Style::kRepr);
  return out;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // The shortest digits that read back as d, then Python's layout: positional when the decimal
  // exponent is in [-4, 16), scientific (at least two exponent digits) otherwise.
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  const std::string_view sci(buf, static_cast<size_t>(r.ptr - buf));
  const size_t e = sci.find('e');
  std::string digits;
  bool negative = false;
  for (const char c : sci.substr(0, e)) {
    if (c == '-') negative = true;
    if (c >= '0' && c <= '9') digits += c;
  }
  const int exponent = std::stoi(std::string(sci.substr(e + 1)));
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    const int point = exponent + 1;  // digits before the decimal point
    if (point <= 0) {
      out.append("0.").append(static_cast<size_t>(-point), '0').append(digits);
    } else if (static_cast<size_t>(point) >= digits.size()) {
      out.append(digits).append(static_cast<size_t>(point) - digits.size(), '0').append(".0");
    } else {
      out.append(digits, 0, static_cast<size_t>(point)).append(".").append(digits, static_cast<size_t>(point));
    }
    return out;
  }
  out.append(digits, 0, 1);
  if (digits.size() > 1) out.append(".").append(digits, 1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof exp_buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out.append(exp_buf);
}

bool is_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

std::string_view lstrip(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp = 0;
    const size_t n = utf8::decode_one(s, i, &cp);
    if (n == 0 || !is_space(cp)) break;
    i += n;
  }
  return s.substr(i);
}

std::string_view rstrip(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    const size_t n = last_char_length(s, end);
    char32_t cp = 0;
    if (utf8::decode_one(s, end - n, &cp) != n || !is_space(cp)) break;
    end -= n;
  }
  return s.substr(0, end);
}

std::string_view strip(std::string_view s) { return rstrip(lstrip(s)); }

std::string_view lstrip_chars(std::string_view s, std::string_view chars) {
  while (!s.empty() && in(s.front(), chars)) s.remove_prefix(1);
  return s;
}

std::string_view rstrip_chars(std::string_view s, std::string_view chars) {
  while (!s.empty() && in(s.back(), chars)) s.remove_suffix(1);
  return s;
}

std::string_view strip_chars(std::string_view s, std::string_view chars) {
  return rstrip_chars(lstrip_chars(s, chars), chars);
}

}  // namespace megadecode::template_values
