// sanitize: address
// Fuzz test of SafetensorsFile::parse: well over 100,000 mutated files (bit flips, truncations,
// header-length edits, character edits of the header text, structured JSON edits of valid headers:
// huge/negative/fractional numbers, overlapping and out-of-range offsets, duplicate names, missing
// fields...). Each must either parse to views entirely inside the buffer (tiling it without
// overlap) or throw megadecode::Error; anything else fails. Runs under ASan+UBSan in CI, where
// each input sits in a heap block of exactly its size so any read past it is caught.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "test_safetensors_util.h"

namespace megadecode {
namespace {

using nlohmann::json;
using Bytes = std::vector<std::byte>;

struct Stats {
  size_t parsed = 0, rejected = 0;
};

// A valid file: 0-6 tensors of random dtype and shape (zero-size ones too), laid out in an order
// other than their names' order, optional metadata, optional space padding.
Bytes random_valid_file(SplitMix64& rng) {
  const Dtype dtypes[] = {Dtype::kBF16, Dtype::kF16, Dtype::kF32};
  json h = json::object();
  if (rng.below(2)) h["__metadata__"] = {{"format", "pt"}, {"note", "fuzz"}};
  const int n = static_cast<int>(rng.below(7));
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  for (int i = n - 1; i > 0; --i) std::swap(order[i], order[rng.below(i + 1)]);
  size_t offset = 0;
  for (int i : order) {
    Dtype d = dtypes[rng.below(3)];
    std::vector<int64_t> shape;
    size_t elems = 1;
    for (int r = static_cast<int>(rng.below(4)); r > 0; --r) {
      shape.push_back(static_cast<int64_t>(rng.below(6)));
      elems *= static_cast<size_t>(shape.back());
    }
    const size_t bytes = elems * dtype_bytes(d);
    h[cat("t", i, rng.below(2) ? ".weight" : "")] = {
        {"dtype", dtype_name(d)}, {"shape", shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = h.dump();
  text.append(rng.below(2) ? (8 - text.size() % 8) % 8 : rng.below(5), ' ');
  return st_test::safetensors_bytes(text, offset);
}

uint64_t header_length(const Bytes& b) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(b[i]);
  return n;
}

void set_header_length(Bytes& b, uint64_t n) {
  for (int i = 0; i < 8; ++i) b[i] = static_cast<std::byte>(n >> (8 * i));
}

std::string header_of(const Bytes& b) {
  return std::string(reinterpret_cast<const char*>(b.data()) + 8, header_length(b));
}

Bytes data_of(const Bytes& b) { return Bytes(b.begin() + 8 + static_cast<ptrdiff_t>(header_length(b)), b.end()); }

Bytes assemble(const std::string& header, const Bytes& data) {
  Bytes out = st_test::safetensors_bytes(header, 0);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// Numbers that break naive arithmetic: negatives, 2^31/2^32/2^63/2^64 edges, fractions, strings.
json nasty_number(SplitMix64& rng, uint64_t near) {
  switch (rng.below(14)) {
    case 0: return -1;
    case 1: return 0;
    case 2: return near + 1;
    case 3: return near > 0 ? near - 1 : 0;
    case 4: return uint64_t{1} << 31;
    case 5: return uint64_t{1} << 32;
    case 6: return INT64_MAX;
    case 7: return UINT64_MAX;
    case 8: return uint64_t{1} << 62;
    case 9: return 1.5;
    case 10: return 1e300;
    case 11: return "4";
    case 12: return nullptr;
    default: return rng.below(1000);
  }
}

// One structured edit of a valid header's JSON.
std::string json_edit(SplitMix64& rng, const std::string& header, size_t data_bytes) {
  json h = json::parse(header);
  std::vector<std::string> names;
  for (const auto& [k, v] : h.items()) {
    if (k != "__metadata__") names.push_back(k);
  }
  if (names.empty() || rng.below(10) == 0) {
    h[cat("x", rng.below(3))] = {{"dtype", "F32"}, {"shape", {nasty_number(rng, 1)}},
                                             {"data_offsets", {nasty_number(rng, 0), nasty_number(rng, data_bytes)}}};
    return h.dump();
  }
  const std::string& name = names[rng.below(names.size())];
  json& e = h[name];
  const std::string& other = names[rng.below(names.size())];
  switch (rng.below(13)) {
    case 0: {
      const char* dtypes[] = {"BF16", "F16", "F32", "F64", "I8", "", "bf16", "U8", "F8_E4M3"};
      e["dtype"] = dtypes[rng.below(9)];
      break;
    }
    case 1: e["dtype"] = nasty_number(rng, 2); break;
    case 2:
      if (!e["shape"].empty()) e["shape"][rng.below(e["shape"].size())] = nasty_number(rng, 3);
      else e["shape"].push_back(nasty_number(rng, 3));
      break;
    case 3:
      if (rng.below(2) && !e["shape"].empty()) e["shape"].erase(e["shape"].size() - 1);
      else e["shape"].push_back(rng.below(4));
      break;
    case 4: e["data_offsets"][rng.below(2)] = nasty_number(rng, data_bytes); break;
    case 5: e["data_offsets"] = h[other]["data_offsets"]; break;  // overlap with another tensor
    case 6: std::swap(e["data_offsets"][0], e["data_offsets"][1]); break;
    case 7: {
      const char* fields[] = {"dtype", "shape", "data_offsets"};
      e.erase(fields[rng.below(3)]);
      break;
    }
    case 8: e["extra"] = {1, 2}; break;
    case 9: h[cat("dup", rng.below(3))] = e; break;  // same bytes under two names
    case 10: h["__metadata__"] = rng.below(2) ? json(7) : json{{"k", rng.below(2) ? json(1) : json::array()}}; break;
    case 11: e = rng.below(2) ? json(nasty_number(rng, 1)) : json::array({1, 2}); break;
    default: e["data_offsets"] = rng.below(2) ? json::array({0}) : json::array({0, 1, 2}); break;
  }
  std::string text = h.dump();
  if (rng.below(8) == 0 && !names.empty()) {  // a duplicated key, which json objects cannot hold
    text.insert(1, "\"" + name + "\":" + h[name].dump() + ",");
  }
  return text;
}

// One random mutation of a file of at least 8 bytes (valid, or already mutated).
Bytes mutate(SplitMix64& rng, Bytes b, const Bytes& other) {
  // Text and JSON edits need a header that lies inside the file (and, for JSON, parses).
  const bool header_inside = header_length(b) <= b.size() - 8;
  const size_t header_end = header_inside ? 8 + header_length(b) : b.size();
  uint64_t choice = rng.below(9);
  if (!header_inside && choice >= 4 && choice <= 7) choice = 0;
  if (choice == 6 || choice == 7) {
    try {
      Bytes data = data_of(b);
      std::string h = json_edit(rng, header_of(b), data.size());
      if (rng.below(4) == 0) data.resize(rng.below(data.size() + 9));
      return assemble(h, data);
    } catch (const json::exception&) {
      choice = 4;  // the header is no longer JSON of the expected shape: edit its text instead
    }
  }
  switch (choice) {
    case 0: {  // bit flips, mostly in the length and header
      for (int k = 1 + static_cast<int>(rng.below(8)); k > 0; --k) {
        size_t pos = rng.below(4) ? rng.below(header_end) : rng.below(b.size());
        b[pos] ^= static_cast<std::byte>(1u << rng.below(8));
      }
      return b;
    }
    case 1: b.resize(rng.below(b.size())); return b;  // truncation
    case 2: {  // extra bytes at the end
      for (int k = 1 + static_cast<int>(rng.below(16)); k > 0; --k) b.push_back(static_cast<std::byte>(rng.next()));
      return b;
    }
    case 3: {  // the header length field
      const uint64_t n = header_length(b);
      const uint64_t choices[] = {0, 1, 7, n - 1, n + 1, n + 8, b.size() - 8, b.size() - 7, uint64_t{1} << 32,
                                  uint64_t{1} << 63, UINT64_MAX, rng.next(), kMaxSafetensorsHeaderBytes + 1};
      set_header_length(b, choices[rng.below(13)]);
      return b;
    }
    case 4: case 5: case 6: case 7: {  // character edits of the header text, length usually fixed up
      std::string h = header_of(b);
      const char kChars[] = "{}[]\":,0123456789-.e \\ul";
      for (int k = 1 + static_cast<int>(rng.below(3)); k > 0; --k) {
        size_t pos = rng.below(h.size() + 1);
        char c = rng.below(4) ? kChars[rng.below(sizeof(kChars) - 1)] : static_cast<char>(rng.next());
        switch (rng.below(3)) {
          case 0: h.insert(pos, 1, c); break;
          case 1: if (pos < h.size()) h.erase(pos, 1); break;
          default: if (pos < h.size()) h[pos] = c; break;
        }
      }
      Bytes out = assemble(h, data_of(b));
      if (rng.below(5) == 0) set_header_length(out, header_length(b));
      return out;
    }
    default: {  // splice: a prefix of this file, a suffix of another
      size_t cut = rng.below(b.size() + 1), from = rng.below(other.size() + 1);
      b.resize(cut);
      b.insert(b.end(), other.begin() + static_cast<ptrdiff_t>(from), other.end());
      return b;
    }
  }
}

// Parses one input from a heap block of exactly its size; checks the outcome.
void check_one(const Bytes& input, Stats& stats, uint64_t seed, size_t iteration) {
  auto block = std::make_unique<std::byte[]>(input.size());
  std::copy(input.begin(), input.end(), block.get());
  std::span<const std::byte> bytes(block.get(), input.size());
  try {
    auto file = SafetensorsFile::parse(bytes, "fuzz.safetensors");
    st_test::expect_views_inside(file->tensors(), bytes);
    // The views tile the data section: sorted by address, none overlaps the next.
    std::vector<const TensorView*> views;
    for (const auto& [name, v] : file->tensors()) views.push_back(&v);
    std::sort(views.begin(), views.end(), [](auto* a, auto* b) {
      return a->data != b->data ? a->data < b->data : a->n_bytes() < b->n_bytes();  // empty ones first
    });
    for (size_t i = 1; i < views.size(); ++i) {
      ASSERT_LE(views[i - 1]->data + views[i - 1]->n_bytes(), views[i]->data) << "overlap, seed " << seed;
    }
    ++stats.parsed;
  } catch (const Error& e) {
    ASSERT_NE(std::string(e.what()).find("fuzz.safetensors"), std::string::npos) << e.what();
    ++stats.rejected;
  } catch (const std::exception& e) {
    FAIL() << "iteration " << iteration << " (seed " << seed << ") threw a non-Error exception: " << e.what()
           << "\nheader: " << std::string(reinterpret_cast<const char*>(input.data()), std::min<size_t>(input.size(), 400));
  }
}

void run_fuzz(uint64_t salt, size_t iterations, int max_stacked, size_t min_parsed_per_mille) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed ^ salt);
  std::vector<Bytes> corpus;
  for (int i = 0; i < 64; ++i) corpus.push_back(random_valid_file(rng));
  Stats stats;
  for (size_t it = 0; it < iterations; ++it) {
    const Bytes& base = corpus[rng.below(corpus.size())];
    Bytes b = base;
    for (int k = 1 + static_cast<int>(rng.below(max_stacked)); k > 0; --k) {
      b = mutate(rng, std::move(b), corpus[rng.below(corpus.size())]);
      if (b.size() < 8) break;  // nothing left to mutate structurally
    }
    check_one(b, stats, seed, it);
    if (::testing::Test::HasFatalFailure() || ::testing::Test::HasNonfatalFailure()) return;
  }
  std::printf("%zu inputs: %zu parsed, %zu rejected with an Error\n", iterations, stats.parsed, stats.rejected);
  // Both outcomes must be exercised, or the mutations are too weak (or too strong) to test anything.
  EXPECT_GE(stats.parsed * 1000, iterations * min_parsed_per_mille);
  EXPECT_GT(stats.rejected, iterations / 4);
}

// The valid corpus itself parses.
TEST(FuzzSafetensors, ValidFilesParse) {
  SplitMix64 rng(test_seed());
  Stats stats;
  for (int i = 0; i < 2000; ++i) check_one(random_valid_file(rng), stats, 0, i);
  EXPECT_EQ(stats.parsed, 2000u);
}

// Four shards of the work so ctest can spread them over cores: 4 x 50,000 = 200,000 inputs.
TEST(FuzzSafetensors, SingleMutations) { run_fuzz(0x1111, 50000, 1, 20); }
TEST(FuzzSafetensors, StackedMutationsA) { run_fuzz(0x2222, 50000, 3, 5); }
TEST(FuzzSafetensors, StackedMutationsB) { run_fuzz(0x3333, 50000, 3, 5); }
TEST(FuzzSafetensors, DeepStacks) { run_fuzz(0x4444, 50000, 6, 2); }

}  // namespace
}  // namespace megadecode
