// The byte-level BPE model of tokenizer.json: vocabulary (token bytes <-> id) and merges by rank.
// Tokens are held as the raw bytes they stand for (the ByteLevel alphabet decoded), so a piece of
// text is encoded straight from its UTF-8 bytes. Encoding a piece applies merges lowest rank
// first, leftmost on ties, as HF tokenizers and the JavaScript reference do. A sharded, locked
// cache of piece -> ids makes repeated words cheap; all methods are safe to call concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace megadecode {

// The 256 byte <-> printable character mapping of GPT-2's ByteLevel (as UTF-8 strings).
const std::string& byte_level_char(uint8_t byte);
// Decodes a ByteLevel token string (e.g. "Ġthe") into bytes; false if a character is not in the
// alphabet.
bool byte_level_decode(std::string_view token, std::string* bytes);

class BpeModel {
 public:
  // vocab: token bytes by id (ids 0..n-1, no gaps); merges: (left, right) token bytes by rank.
  // cache_shard_capacity: cached pieces per shard (of 16) before the shard is cleared.
  BpeModel(std::vector<std::string> vocab, const std::vector<std::pair<std::string, std::string>>& merges,
           size_t cache_shard_capacity = 8192);

  // Appends the ids of one pre-tokenized piece.
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const;

  int size() const { return static_cast<int>(vocab_.size()); }
  const std::string& token_bytes(int32_t id) const { return vocab_[static_cast<size_t>(id)]; }
  int32_t find(std::string_view bytes) const;  // -1 if absent

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  const Merge* find_merge(int32_t left, int32_t right) const;
  void insert_merge(int32_t left, int32_t right, Merge merge);
  void merge_short(std::vector<int32_t>& symbols) const;  // O(n^2), for short pieces
  void merge_long(std::vector<int32_t>& symbols) const;   // O(n log n) with a heap

  std::vector<std::string> vocab_;                 // [n_vocab] token bytes
  std::unordered_map<std::string, int32_t> ids_;   // token bytes -> id
  // Open-addressing hash table (linear probing) of (left id, right id) -> rank, merged id: the
  // innermost lookup of the merge loop, so kept flat.
  struct MergeSlot {
    uint64_t key;  // kEmptySlot when free
    Merge merge;
  };
  static constexpr uint64_t kEmptySlot = ~uint64_t{0};
  std::vector<MergeSlot> merge_slots_;  // [power of two]
  uint64_t merge_mask_ = 0;
  int32_t byte_ids_[256];                          // id of each single-byte token

  static constexpr size_t kCacheShards = 16;
  static constexpr size_t kMaxCachedPieceBytes = 64;
  struct PieceHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct CacheShard {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>, PieceHash, std::equal_to<>> map;
  };
  std::unique_ptr<CacheShard[]> cache_;
  size_t cache_shard_capacity_;
};

}  // namespace megadecode
