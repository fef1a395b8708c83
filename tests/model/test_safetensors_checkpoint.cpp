// sanitize: address
// Safetensors checkpoints: write_checkpoint round trips (all dtypes, single file and shards, HF's
// byte layout) and every inconsistency between an index and its shards is an Error naming both.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "test_safetensors_util.h"

namespace megadecode {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using st_test::TempDir;

// Random tensors of every dtype and awkward shapes (odd sizes, zero-size, scalar), filled from the seed.
std::vector<TensorToWrite> random_tensors(SplitMix64& rng, int n) {
  std::vector<TensorToWrite> out;
  const Dtype dtypes[] = {Dtype::kBF16, Dtype::kF16, Dtype::kF32};
  for (int i = 0; i < n; ++i) {
    TensorToWrite t;
    t.name = "layer." + std::to_string(i) + (i % 2 ? ".weight" : ".bias");
    t.dtype = dtypes[rng.below(3)];
    const int rank = static_cast<int>(rng.below(4));
    for (int d = 0; d < rank; ++d) t.shape.push_back(static_cast<int64_t>(rng.below(i % 7 == 3 ? 2 : 40)));
    out.push_back(t);
  }
  return out;
}

// Deterministic content per (seed, name, byte).
std::byte content(uint64_t seed, const std::string& name, size_t i) {
  return static_cast<std::byte>((mix64(seed ^ std::hash<std::string>{}(name)) + i * 0x9e3779b97f4a7c15ull) >> 56);
}

void write_random(const fs::path& dir, const std::vector<TensorToWrite>& tensors, uint64_t seed, size_t max_shard) {
  write_checkpoint(
      dir, tensors,
      [&](const TensorToWrite& t, std::span<std::byte> out) {
        for (size_t i = 0; i < out.size(); ++i) out[i] = content(seed, t.name, i);
      },
      max_shard);
}

void expect_round_trip(const fs::path& dir, const std::vector<TensorToWrite>& tensors, uint64_t seed) {
  Checkpoint c = Checkpoint::open(dir);
  ASSERT_EQ(c.tensors().size(), tensors.size());
  for (const TensorToWrite& t : tensors) {
    const TensorView& v = c.tensors().at(t.name);
    EXPECT_EQ(v.dtype, t.dtype) << t.name;
    EXPECT_EQ(v.shape, t.shape) << t.name;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % dtype_bytes(v.dtype), 0u) << t.name << " misaligned";
    for (size_t i = 0; i < v.n_bytes(); ++i) ASSERT_EQ(v.data[i], content(seed, t.name, i)) << t.name << " byte " << i;
  }
}

TEST(SafetensorsWrite, SingleFileRoundTripAllDtypes) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  TempDir dir("st-single");
  std::vector<TensorToWrite> tensors = random_tensors(rng, 23);
  write_random(dir.path(), tensors, seed, size_t{1} << 30);
  EXPECT_TRUE(fs::exists(dir.path() / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir.path() / "model.safetensors.index.json"));
  expect_round_trip(dir.path(), tensors, seed);

  // HF's layout: header length a multiple of 8, padded with spaces, format "pt" metadata.
  std::ifstream in(dir.path() / "model.safetensors", std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  std::string header(n, '\0');
  in.read(header.data(), static_cast<std::streamsize>(n));
  json h = json::parse(header);
  EXPECT_EQ(h["__metadata__"]["format"], "pt");
  EXPECT_EQ(header.find_last_not_of(' ') + 1, header.find_last_of('}') + 1);
}

TEST(SafetensorsWrite, ShardedRoundTripAndIndex) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  TempDir dir("st-sharded");
  std::vector<TensorToWrite> tensors = random_tensors(rng, 40);
  size_t total = 0;
  for (const TensorToWrite& t : tensors) {
    size_t b = dtype_bytes(t.dtype);
    for (int64_t d : t.shape) b *= static_cast<size_t>(d);
    total += b;
  }
  const size_t max_shard = 1000 + rng.below(2000);
  write_random(dir.path(), tensors, seed, max_shard);
  ASSERT_FALSE(fs::exists(dir.path() / "model.safetensors"));
  std::ifstream in(dir.path() / "model.safetensors.index.json");
  json index = json::parse(in);
  EXPECT_EQ(index["metadata"]["total_size"].get<size_t>(), total);
  std::set<std::string> shards;
  for (const auto& [name, shard] : index["weight_map"].items()) shards.insert(shard.get<std::string>());
  ASSERT_GT(shards.size(), 1u);
  size_t k = 0;
  for (const std::string& s : shards) {  // model-00001-of-0000N.safetensors, ..., every one used
    char expected[64];
    std::snprintf(expected, sizeof(expected), "model-%05zu-of-%05zu.safetensors", ++k, shards.size());
    EXPECT_EQ(s, expected);
  }
  expect_round_trip(dir.path(), tensors, seed);

  // Rewriting as one file removes the shards, and back.
  write_random(dir.path(), tensors, seed + 1, size_t{1} << 30);
  size_t n_files = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) n_files += e.path().extension() == ".safetensors";
  EXPECT_EQ(n_files, 1u);
  EXPECT_FALSE(fs::exists(dir.path() / "model.safetensors.index.json"));
  expect_round_trip(dir.path(), tensors, seed + 1);
  write_random(dir.path(), tensors, seed + 2, max_shard);
  EXPECT_FALSE(fs::exists(dir.path() / "model.safetensors"));
  expect_round_trip(dir.path(), tensors, seed + 2);
}

TEST(SafetensorsWrite, TensorLargerThanShardLimitGetsItsOwnShard) {
  TempDir dir("st-big");
  std::vector<TensorToWrite> tensors = {{"a", Dtype::kF32, {10}}, {"big", Dtype::kF32, {100}}, {"c", Dtype::kBF16, {3}}};
  write_random(dir.path(), tensors, 5, 64);
  std::ifstream in(dir.path() / "model.safetensors.index.json");
  json index = json::parse(in);
  EXPECT_EQ(index["weight_map"]["a"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["big"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["c"], "model-00003-of-00003.safetensors");
  expect_round_trip(dir.path(), tensors, 5);
}

TEST(SafetensorsWrite, RejectsBadSpecs) {
  TempDir dir("st-bad");
  auto fill = [](const TensorToWrite&, std::span<std::byte>) {};
  EXPECT_THROW(write_checkpoint(dir.path(), {{"a", Dtype::kF32, {1}}, {"a", Dtype::kF32, {1}}}, fill, 100), Error);
  EXPECT_THROW(write_checkpoint(dir.path(), {{"a", Dtype::kF32, {-1}}}, fill, 100), Error);
  EXPECT_THROW(write_checkpoint(dir.path(), {{"__metadata__", Dtype::kF32, {1}}}, fill, 100), Error);
  EXPECT_THROW(write_checkpoint(dir.path(), {{"a", Dtype::kF32, {1}}}, fill, 0), Error);
}

TEST(SafetensorsWrite, FailedFillLeavesNoPartialFiles) {
  TempDir dir("st-fail");
  auto fill = [](const TensorToWrite& t, std::span<std::byte>) {
    if (t.name == "b") throw Error("fill failed");
  };
  for (size_t max_shard : {size_t{8}, size_t{1} << 20}) {
    EXPECT_THROW(write_checkpoint(dir.path(), {{"a", Dtype::kF32, {2}}, {"b", Dtype::kF32, {2}}}, fill, max_shard),
                 Error);
    for (const auto& e : fs::directory_iterator(dir.path())) {
      EXPECT_NE(e.path().extension(), ".partial") << e.path();
      EXPECT_NE(e.path().filename(), "model.safetensors.index.json");
    }
    EXPECT_THROW(Checkpoint::open(dir.path()), Error);
  }
}

// A sharded checkpoint of three one-tensor shards, then one inconsistency at a time.
class ShardedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    tensors_ = {{"t0", Dtype::kF32, {4}}, {"t1", Dtype::kBF16, {8}}, {"t2", Dtype::kF16, {8}}};
    write_random(dir_.path(), tensors_, 9, 16);
    std::ifstream in(dir_.path() / "model.safetensors.index.json");
    index_ = json::parse(in);
  }
  void write_index(const json& j) { st_test::write_text(dir_.path() / "model.safetensors.index.json", j.dump()); }
  std::string open_error() {
    try {
      Checkpoint::open(dir_.path());
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  void expect_error(std::initializer_list<std::string> parts) {
    std::string err = open_error();
    ASSERT_FALSE(err.empty());
    for (const std::string& p : parts) EXPECT_NE(err.find(p), std::string::npos) << "missing \"" << p << "\" in: " << err;
  }
  TempDir dir_{"st-index"};
  std::vector<TensorToWrite> tensors_;
  json index_;
};

TEST_F(ShardedCheckpoint, OpensWhenConsistent) {
  EXPECT_EQ(open_error(), "");
  expect_round_trip(dir_.path(), tensors_, 9);
}

TEST_F(ShardedCheckpoint, MissingShard) {
  fs::remove(dir_.path() / "model-00002-of-00003.safetensors");
  expect_error({"model-00002-of-00003.safetensors", "t1", "missing"});
}

TEST_F(ShardedCheckpoint, IndexNamesTensorItsShardLacks) {
  index_["weight_map"]["ghost"] = "model-00001-of-00003.safetensors";
  write_index(index_);
  expect_error({"ghost", "model-00001-of-00003.safetensors", "does not hold"});
}

TEST_F(ShardedCheckpoint, ShardHoldsTensorTheIndexDoesNotName) {
  std::string h = R"({"t1":{"dtype":"BF16","shape":[8],"data_offsets":[0,16]},"extra":{"dtype":"F16","shape":[1],"data_offsets":[16,18]}})";
  st_test::write_bytes(dir_.path() / "model-00002-of-00003.safetensors", st_test::safetensors_bytes(h, 18));
  expect_error({"model-00002-of-00003.safetensors", "\"extra\"", "does not name"});
}

TEST_F(ShardedCheckpoint, SameTensorInTwoShards) {
  // Shard 3 rewritten to hold t1 as well; the index keeps t1 in shard 2.
  std::string h = R"({"t1":{"dtype":"BF16","shape":[8],"data_offsets":[0,16]},"t2":{"dtype":"F16","shape":[8],"data_offsets":[16,32]}})";
  st_test::write_bytes(dir_.path() / "model-00003-of-00003.safetensors", st_test::safetensors_bytes(h, 32));
  expect_error({"\"t1\"", "model-00003-of-00003.safetensors", "assigns it to model-00002-of-00003.safetensors"});
}

TEST_F(ShardedCheckpoint, BadIndexFiles) {
  st_test::write_text(dir_.path() / "model.safetensors.index.json", "{not json");
  expect_error({"model.safetensors.index.json", "not valid JSON"});
  write_index(json{{"metadata", json::object()}});
  expect_error({"weight_map"});
  write_index(json{{"weight_map", {{"t0", 3}}}});
  expect_error({"\"t0\"", "not a file name"});
  write_index(json{{"weight_map", {{"t0", "../model-00001-of-00003.safetensors"}}}});
  expect_error({"\"t0\"", "not a file in"});
  write_index(json{{"weight_map", json::object()}});
  expect_error({"empty"});
}

TEST_F(ShardedCheckpoint, CorruptShardNamesItsFile) {
  fs::resize_file(dir_.path() / "model-00003-of-00003.safetensors", 20);
  expect_error({"model-00003-of-00003.safetensors"});
}

TEST(Checkpoint, EmptyDirectoryAndMissingDirectory) {
  TempDir dir("st-empty");
  try {
    Checkpoint::open(dir.path());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("neither model.safetensors"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Checkpoint::open(dir.path() / "absent"), Error);
}

TEST(Checkpoint, MovedCheckpointKeepsViewsValid) {
  TempDir dir("st-move");
  std::vector<TensorToWrite> tensors = {{"a", Dtype::kF32, {3}}, {"b", Dtype::kBF16, {5}}};
  write_random(dir.path(), tensors, 11, 1 << 20);
  Checkpoint c = Checkpoint::open(dir.path());
  const std::byte* a = c.tensors().at("a").data;
  Checkpoint moved = std::move(c);
  EXPECT_EQ(moved.tensors().at("a").data, a);
  expect_round_trip(dir.path(), tensors, 11);
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(moved.tensors().at("a").data[i], content(11, "a", i));
}

}  // namespace
}  // namespace megadecode
