// `megadecode bench tokenizer [--model DIR] [--bytes N] [--repeats R] [--seed S] [--json FILE]`:
// single-thread throughput (best of R runs; wall and thread CPU time) of encode (first pass with
// an empty BPE cache, then warm passes),
// decode and the streaming detokenizer on ~1 MB of mixed synthetic text (prose, code, CJK,
// emoji, numbers, whitespace runs, special tokens; see bench/sample_text.h), and of encode
// on very long words (a BPE stress case kept out of the mixed text).
#include <algorithm>
#include <ctime>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "core/args.h"
#include "core/check.h"
#include "core/json_file.h"
#include "core/stopwatch.h"
#include "bench/sample_text.h"
#include "tokenizer/tokenizer.h"

namespace megadecode {
namespace {

// CPU time of this thread: the figure for "one core" even when other processes share the machine.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Runs fn `repeats` times; returns the fastest wall time and the fastest thread CPU time.
template <typename Fn>
std::pair<double, double> best_of(int64_t repeats, Fn&& fn) {
  double wall = 1e30, cpu = 1e30;
  for (int64_t r = 0; r < repeats; ++r) {
    const Stopwatch t0;
    const double c0 = thread_cpu_seconds();
    fn();
    cpu = std::min(cpu, thread_cpu_seconds() - c0);
    wall = std::min(wall, t0.seconds());
  }
  return {wall, cpu};
}

}  // namespace

int bench_tokenizer(int argc, char** argv) {
  const Args args(argc, argv, {"model", "bytes", "repeats", "seed", "json"}, {"help"});
  if (args.flag("help")) {
    std::printf("usage: megadecode bench tokenizer [--model DIR (data/tokenizer/qwen3)] [--bytes N (1 MiB)] [--repeats R (5)]\n"
                "                                  [--seed S (1)] [--json FILE]\n");
    return 0;
  }
  const std::string model_dir = args.get("model", std::string(MEGADECODE_SOURCE_DIR) + "/data/tokenizer/qwen3");
  const int64_t n_bytes = args.get_int("bytes", 1 << 20);
  const int64_t repeats = args.get_int("repeats", 5);
  MD_REQUIRE(n_bytes > 0 && repeats > 0, "--bytes and --repeats must be positive");

  const Stopwatch t0;
  const std::unique_ptr<Tokenizer> tok = Tokenizer::load(model_dir);
  const double load_s = t0.seconds();
  const std::string text =
      sample_text::mixed_text(static_cast<uint64_t>(args.get_int("seed", 1)), static_cast<size_t>(n_bytes));
  const double mb = static_cast<double>(text.size()) / 1e6;

  std::vector<int32_t> ids;
  const auto cold = best_of(1, [&] { ids = tok->encode(text, false); });  // empty BPE cache
  const auto warm = best_of(repeats, [&] { MD_CHECK(tok->encode(text, false) == ids, "encode is not deterministic"); });
  std::string back;
  const auto decode = best_of(repeats, [&] { back = tok->decode(ids, false); });
  const auto stream = best_of(repeats, [&] {
    StreamingDetokenizer detok(*tok, false);
    size_t streamed = 0;
    for (const int32_t id : ids) streamed += detok.push(id).size();
    streamed += detok.flush().size();
    MD_CHECK(streamed == back.size());
  });

  std::printf("tokenizer benchmark: %.3f MB of mixed text, %zu tokens (%.2f bytes/token), load %.0f ms, best of %lld\n",
              mb, ids.size(), static_cast<double>(text.size()) / static_cast<double>(ids.size()), load_s * 1e3,
              static_cast<long long>(repeats));
  std::printf("  %-26s %10s %10s %14s\n", "", "MB/s", "MB/s (CPU)", "tokens/s (CPU)");
  auto row = [&](const char* name, std::pair<double, double> t) {
    std::printf("  %-26s %10.1f %10.1f %14.0f\n", name, mb / t.first, mb / t.second,
                static_cast<double>(ids.size()) / t.second);
  };
  row("encode (cold BPE cache)", cold);
  row("encode (warm)", warm);
  row("decode", decode);
  row("streaming detokenizer", stream);
  // Stress: words of 200-20,000 characters, which no cache helps (not part of the mixed text).
  const std::string long_words = sample_text::text_of_kind(sample_text::Kind::kLongWords, 7, text.size() / 4);
  size_t n_long_ids = 0;
  const auto long_t = best_of(repeats, [&] { n_long_ids = tok->encode(long_words, false).size(); });
  std::printf("  %-26s %10.1f %10.1f %14.0f   (%.2f MB of 200-20,000 character words)\n", "encode long words",
              static_cast<double>(long_words.size()) / 1e6 / long_t.first,
              static_cast<double>(long_words.size()) / 1e6 / long_t.second,
              static_cast<double>(n_long_ids) / long_t.second, static_cast<double>(long_words.size()) / 1e6);

  if (args.has("json")) {
    const nlohmann::json j = {{"benchmark", "tokenizer"},
                              {"bytes", text.size()},
                              {"tokens", ids.size()},
                              {"load_s", load_s},
                              {"encode_cold_mb_per_s", mb / cold.first},
                              {"encode_warm_mb_per_s", mb / warm.first},
                              {"encode_warm_cpu_mb_per_s", mb / warm.second},
                              {"decode_mb_per_s", mb / decode.first},
                              {"stream_mb_per_s", mb / stream.first},
                              {"encode_warm_tokens_per_s", static_cast<double>(ids.size()) / warm.first},
                              {"encode_long_words_mb_per_s", static_cast<double>(long_words.size()) / 1e6 / long_t.first}};
    write_json(args.get("json", ""), j);
  }
  return 0;
}

}  // namespace megadecode
