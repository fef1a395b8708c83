// The pre-tokenizer stages and the delimiter behaviours of Split (see pretokenize.h).
#include "tokenizer/pretokenize.h"

#include "core/check.h"
#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace megadecode {
namespace {

// The spans of piece as a Split pattern cuts it: matches and the gaps between them, in order.
void find_spans(const PreTokenizerStage& stage, std::string_view piece, std::vector<SplitSpan>& spans) {
  spans.clear();
  size_t prev = 0;
  for (size_t from = 0; from < piece.size();) {
    size_t start = 0, len = 0;
    if (!stage.literal.empty()) {
      start = piece.find(stage.literal, from);
      len = start == std::string_view::npos ? 0 : stage.literal.size();
    } else {
      len = split_pattern_find(stage.pattern, piece, from, &start);
    }
    if (len == 0) break;
    if (prev < start) spans.push_back({prev, start, false});
    spans.push_back({start, start + len, true});
    prev = from = start + len;
  }
  if (prev < piece.size()) spans.push_back({prev, piece.size(), false});
  if (stage.invert) {
    for (SplitSpan& s : spans) s.match = !s.match;
  }
}

// Digits: each \p{N} character is a match; the characters between form one gap.
void find_digit_spans(std::string_view piece, std::vector<SplitSpan>& spans) {
  spans.clear();
  size_t prev = 0;
  for (size_t i = 0; i < piece.size();) {
    char32_t cp;
    const size_t n = utf8::decode_one(piece, i, &cp);
    MD_CHECK(n != 0, "pre-tokenizer needs valid UTF-8");
    if (unicode::char_class(cp) & unicode::kNumber) {
      if (prev < i) spans.push_back({prev, i, false});
      spans.push_back({i, i + n, true});
      prev = i + n;
    }
    i += n;
  }
  if (prev < piece.size()) spans.push_back({prev, piece.size(), false});
}

}  // namespace

void split_by_behavior(std::string_view piece, const std::vector<SplitSpan>& spans, SplitBehavior behavior,
                       std::vector<std::string_view>& out) {
  const size_t first = out.size();  // pieces before `first` belong to earlier calls
  auto emit = [&](const SplitSpan& s) { out.push_back(piece.substr(s.start, s.end - s.start)); };
  auto extend_last = [&](size_t end) {
    const auto start = static_cast<size_t>(out.back().data() - piece.data());
    out.back() = piece.substr(start, end - start);
  };
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const SplitSpan& s : spans) {
        if (!s.match) emit(s);
      }
      return;
    case SplitBehavior::kIsolated:
      for (const SplitSpan& s : spans) emit(s);
      return;
    case SplitBehavior::kContiguous:  // runs of matches and runs of non-matches
      for (const SplitSpan& s : spans) {
        if (out.size() > first && s.match == previous_match) {
          extend_last(s.end);
        } else {
          emit(s);
        }
        previous_match = s.match;
      }
      return;
    case SplitBehavior::kMergedWithPrevious:  // a match joins the piece before it
      for (const SplitSpan& s : spans) {
        if (out.size() > first && s.match && !previous_match) {
          extend_last(s.end);
        } else {
          emit(s);
        }
        previous_match = s.match;
      }
      return;
    case SplitBehavior::kMergedWithNext: {  // a match joins the piece after it
      std::vector<SplitSpan> merged;
      for (size_t k = spans.size(); k-- > 0;) {
        const SplitSpan& s = spans[k];
        if (!merged.empty() && s.match && !previous_match) {
          merged.back().start = s.start;
        } else {
          merged.push_back(s);
        }
        previous_match = s.match;
      }
      for (size_t k = merged.size(); k-- > 0;) emit(merged[k]);
      return;
    }
  }
}

void PreTokenizer::run(std::string_view text, std::vector<std::string_view>& pieces,
                       std::deque<std::string>& arena) const {
  std::vector<std::string_view> current{text}, next;
  std::vector<SplitSpan> spans;
  for (const PreTokenizerStage& stage : stages_) {
    const bool byte_level = stage.type == PreTokenizerStage::Type::kByteLevel;
    if (byte_level && !stage.add_prefix_space && !stage.use_regex) continue;  // nothing to do on bytes
    next.clear();
    for (std::string_view piece : current) {
      switch (stage.type) {
        case PreTokenizerStage::Type::kSplit:
          if (stage.behavior == SplitBehavior::kIsolated && stage.literal.empty()) {
            split_pattern_pieces(stage.pattern, piece, next);  // invert changes nothing when isolated
            break;
          }
          find_spans(stage, piece, spans);
          split_by_behavior(piece, spans, stage.behavior, next);
          break;
        case PreTokenizerStage::Type::kDigits:
          find_digit_spans(piece, spans);
          split_by_behavior(piece, spans,
                            stage.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, next);
          break;
        case PreTokenizerStage::Type::kByteLevel:
          if (stage.add_prefix_space && (piece.empty() || piece[0] != ' ')) {
            std::string& prefixed = arena.emplace_back(1, ' ');
            prefixed += piece;
            piece = prefixed;
          }
          if (!stage.use_regex) {
            next.push_back(piece);
            break;
          }
          split_pattern_pieces(SplitPattern::kGpt2, piece, next);
          break;
      }
    }
    current.swap(next);
  }
  for (const std::string_view piece : current) {
    if (!piece.empty()) pieces.push_back(piece);
  }
}

void pretokenize(std::string_view text, std::vector<std::string_view>& pieces) {
  split_pattern_pieces(SplitPattern::kQwen2, text, pieces);
}

}  // namespace megadecode
