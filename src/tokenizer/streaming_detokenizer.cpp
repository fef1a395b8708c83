// StreamingDetokenizer: holds back only a truncated UTF-8 character at the end of the byte
// stream. Lossy decoding runs left to right and a byte sequence is final as soon as it is either
// a complete character or provably invalid, so everything before such a tail can be emitted now
// and the concatenation of outputs equals decode() of all ids.
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace megadecode {

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

std::string StreamingDetokenizer::push(int32_t id) {
  std::string out;
  if (tokenizer_.is_added_token(id)) {
    // Skipped special tokens vanish before decoding: the bytes around them stay one stream.
    if (skip_special_ && tokenizer_.is_special(id)) return out;
    // An added token ends the byte-level run: whatever is pending is final (lossy).
    utf8::append_lossy(out, pending_);
    pending_.clear();
    out += tokenizer_.token_bytes(id);
    return out;
  }
  pending_ += tokenizer_.token_bytes(id);
  const size_t keep = utf8::incomplete_tail_length(pending_);
  utf8::append_lossy(out, std::string_view(pending_).substr(0, pending_.size() - keep));
  pending_.erase(0, pending_.size() - keep);
  return out;
}

std::string StreamingDetokenizer::flush() {
  std::string out;
  utf8::append_lossy(out, pending_);
  pending_.clear();
  return out;
}

}  // namespace megadecode
