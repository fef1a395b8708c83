// The held-back tail of incremental tag scanning (reasoning and tool-call parsers): how much of
// the end of some text could still grow into a tag once more text arrives.
#pragma once

#include <algorithm>
#include <string_view>

namespace megadecode {

// Length of the longest suffix of s that is a proper prefix of tag.
inline size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace megadecode
