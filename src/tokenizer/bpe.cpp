// Byte-level BPE: the ByteLevel alphabet, the vocabulary/merge tables and the merge loop.
#include "tokenizer/bpe.h"

#include <algorithm>
#include <array>
#include <functional>
#include <limits>

#include "core/check.h"
#include "core/rng.h"
#include "tokenizer/utf8.h"

namespace megadecode {
namespace {

constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();
constexpr size_t kShortPiece = 48;  // bytes; longer pieces use the heap-based merge loop

struct ByteLevelTables {
  std::array<std::string, 256> chars;  // byte -> UTF-8 of its printable stand-in
  std::array<int16_t, 324> bytes;      // stand-in code point -> byte, -1 if none
  ByteLevelTables() {
    bytes.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      utf8::append(chars[static_cast<size_t>(b)], cp);
      bytes[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& byte_level() {
  static const ByteLevelTables tables;
  return tables;
}

}  // namespace

const std::string& byte_level_char(uint8_t byte) { return byte_level().chars[byte]; }

bool byte_level_decode(std::string_view token, std::string* bytes) {
  bytes->clear();
  for (size_t i = 0; i < token.size();) {
    char32_t cp;
    const size_t n = utf8::decode_one(token, i, &cp);
    if (n == 0 || cp >= byte_level().bytes.size() || byte_level().bytes[cp] < 0) return false;
    bytes->push_back(static_cast<char>(byte_level().bytes[cp]));
    i += n;
  }
  return true;
}

BpeModel::BpeModel(std::vector<std::string> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   size_t cache_shard_capacity)
    : vocab_(std::move(vocab)), cache_(new CacheShard[kCacheShards]), cache_shard_capacity_(cache_shard_capacity) {
  ids_.reserve(vocab_.size());
  for (size_t id = 0; id < vocab_.size(); ++id) {
    const bool inserted = ids_.emplace(vocab_[id], static_cast<int32_t>(id)).second;
    MD_REQUIRE(inserted, "tokenizer.json: two vocabulary entries stand for the same bytes (id ", id, ")");
  }
  for (int b = 0; b < 256; ++b) {
    const int32_t id = find(std::string(1, static_cast<char>(b)));
    MD_REQUIRE(id >= 0, "tokenizer.json: the vocabulary lacks the single-byte token for byte ", b);
    byte_ids_[b] = id;
  }
  size_t n_slots = 1024;
  while (n_slots < 2 * merges.size()) n_slots *= 2;
  merge_slots_.assign(n_slots, MergeSlot{kEmptySlot, Merge{0, 0}});
  merge_mask_ = n_slots - 1;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const int32_t l = find(left), r = find(right), m = find(left + right);
    MD_REQUIRE(l >= 0 && r >= 0 && m >= 0, "tokenizer.json: merge ", rank, " names a token not in the vocabulary");
    // A repeated merge keeps its last rank, as the reference implementations build their maps.
    insert_merge(l, r, Merge{static_cast<int32_t>(rank), m});
  }
}

int32_t BpeModel::find(std::string_view bytes) const {
  auto it = ids_.find(std::string(bytes));
  return it == ids_.end() ? -1 : it->second;
}

const BpeModel::Merge* BpeModel::find_merge(int32_t left, int32_t right) const {
  const uint64_t key = pair_key(left, right);
  for (uint64_t slot = mix64(key) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
    const MergeSlot& s = merge_slots_[slot];
    if (s.key == key) return &s.merge;
    if (s.key == kEmptySlot) return nullptr;
  }
}

void BpeModel::insert_merge(int32_t left, int32_t right, Merge merge) {
  const uint64_t key = pair_key(left, right);
  for (uint64_t slot = mix64(key) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
    MergeSlot& s = merge_slots_[slot];
    if (s.key == key || s.key == kEmptySlot) {
      s = MergeSlot{key, merge};
      return;
    }
  }
}

void BpeModel::merge_short(std::vector<int32_t>& symbols) const {
  std::vector<int32_t> ranks(symbols.size());  // ranks[k]: rank of (symbols[k], symbols[k+1])
  auto rank_at = [&](size_t k) {
    const Merge* m = find_merge(symbols[k], symbols[k + 1]);
    return m ? m->rank : kNoRank;
  };
  for (size_t k = 0; k + 1 < symbols.size(); ++k) ranks[k] = rank_at(k);
  while (symbols.size() > 1) {
    size_t best = 0;
    for (size_t k = 1; k + 1 < symbols.size(); ++k) {
      if (ranks[k] < ranks[best]) best = k;
    }
    if (ranks[best] == kNoRank) break;
    symbols[best] = find_merge(symbols[best], symbols[best + 1])->merged_id;
    symbols.erase(symbols.begin() + static_cast<ptrdiff_t>(best) + 1);
    ranks.erase(ranks.begin() + static_cast<ptrdiff_t>(best) + 1);
    if (best + 1 < symbols.size()) ranks[best] = rank_at(best);
    if (best > 0) ranks[best - 1] = rank_at(best - 1);
  }
}

void BpeModel::merge_long(std::vector<int32_t>& symbols) const {
  const size_t n = symbols.size();
  std::vector<int32_t> prev(n), next(n);  // [n] linked list over positions; -1 ends it
  for (size_t k = 0; k < n; ++k) {
    prev[k] = static_cast<int32_t>(k) - 1;
    next[k] = k + 1 < n ? static_cast<int32_t>(k + 1) : -1;
  }
  struct Candidate {
    int32_t rank, pos, left, right, merged;
    // Heap order: lowest rank first, then leftmost position.
    bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Candidate> heap;  // a max-heap under operator< above, i.e. a min-heap by (rank, pos)
  heap.reserve(n);
  auto push = [&](int32_t pos) {
    const int32_t nx = next[static_cast<size_t>(pos)];
    if (nx < 0) return;
    const int32_t l = symbols[static_cast<size_t>(pos)], r = symbols[static_cast<size_t>(nx)];
    if (const Merge* m = find_merge(l, r)) {
      heap.push_back(Candidate{m->rank, pos, l, r, m->merged_id});
      std::push_heap(heap.begin(), heap.end());
    }
  };
  for (size_t k = 0; k + 1 < n; ++k) push(static_cast<int32_t>(k));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate c = heap.back();
    heap.pop_back();
    const auto pos = static_cast<size_t>(c.pos);
    const int32_t nx = next[pos];
    // Stale when either side changed since the candidate was pushed (a merged-away position
    // has symbol -1; merges only ever lengthen a symbol, so an equal id means unchanged).
    if (nx < 0 || symbols[pos] != c.left || symbols[static_cast<size_t>(nx)] != c.right) continue;
    symbols[pos] = c.merged;
    symbols[static_cast<size_t>(nx)] = -1;
    next[pos] = next[static_cast<size_t>(nx)];
    if (next[pos] >= 0) prev[static_cast<size_t>(next[pos])] = c.pos;
    push(c.pos);
    if (prev[pos] >= 0) push(prev[pos]);
  }
  size_t out = 0;
  for (int32_t k = 0; k >= 0; k = next[static_cast<size_t>(k)]) symbols[out++] = symbols[static_cast<size_t>(k)];
  symbols.resize(out);
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    ids.push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  CacheShard* shard = nullptr;
  if (cacheable) {
    shard = &cache_[(PieceHash{}(piece) >> 7) % kCacheShards];
    std::lock_guard<std::mutex> lock(shard->mutex);
    auto it = shard->map.find(piece);
    if (it != shard->map.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> symbols(piece.size());  // [n_bytes] then [n_tokens] as merges apply
  for (size_t k = 0; k < piece.size(); ++k) symbols[k] = byte_ids_[static_cast<uint8_t>(piece[k])];
  if (symbols.size() <= kShortPiece) {
    merge_short(symbols);
  } else {
    merge_long(symbols);
  }
  ids.insert(ids.end(), symbols.begin(), symbols.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard->mutex);
    if (shard->map.size() >= cache_shard_capacity_) shard->map.clear();
    shard->map.emplace(std::string(piece), std::move(symbols));
  }
}

}  // namespace megadecode
