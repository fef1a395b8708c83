// `megadecode bench engine`: the engine loop's host cost per decode step, on the CPU.
// The real scheduler, output processing, Qwen3 detokenizer and stop strings drive the null backend
// (null_backend.h: cuda-mk's host work per step, without the device) at each batch size: B
// sequences of --context tokens decode --warmup + --steps steps, all running; each iteration's
// StepTimes give the host's phases. Reports steps/s and host us per step (the sum of the phases)
// per batch; --json FILE writes them as records {"batch", "steps_per_s", "host_us_per_step", ...}.
// --fresh-plan plans each step with make_plan (cuda-mk at 0f6c589), --no-overlap runs the plain
// loop: the "before" of docs/perf/journal/2026-12.md. --device-us T lets each step run T us on the
// "device"; --ragged gives the prompts lengths in [context / 2, context] instead of all --context.
#include <cstdio>
#include <thread>

#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "bench/null_backend.h"
#include "core/args.h"
#include "core/check.h"
#include "core/json_file.h"
#include "core/stopwatch.h"
#include "engine/scheduler.h"
#include "engine/text_decoders.h"
#include "model/presets.h"
#include "tokenizer/sample_text.h"
#include "tokenizer/tokenizer.h"

namespace megadecode {
namespace {

constexpr const char* kUsage =
    "usage: megadecode bench engine [--preset qwen3-30b-a3b] [--batch 1,8,64,256] [--context 1024]\n"
    "         [--steps 200] [--warmup 20] [--sms 132] [--policy default] [--block-size 16]\n"
    "         [--fresh-plan] [--no-overlap] [--device-us 0] [--ragged] [--stop STR | --no-stop]\n"
    "         [--tokenizer DIR (data/tokenizer/qwen3)] [--seed 1] [--log-steps] [--json FILE [--note TEXT]]\n"
    "         [--logprobs N [--host-logprobs]]\n"
    "  --logprobs N: every request asks for its tokens' logprobs and N top ones (0..20); the null backend\n"
    "      returns them as a CUDA backend does (computed on the device); --host-logprobs: it returns the\n"
    "      logits instead and the engine computes them over the vocabulary (the path before)\n";

struct EngineBenchOptions {
  std::string preset = "qwen3-30b-a3b";
  std::vector<int> batches = {1, 8, 64, 256};
  int context = 1024;
  int steps = 200;
  int warmup = 20;
  int block_size = 16;
  NullBackendOptions null;
  bool overlap = true;
  bool ragged = false;
  std::vector<std::string> stop = {"\nObservation:", "<|user|>"};
  std::string tokenizer_dir = std::string(MEGADECODE_SOURCE_DIR) + "/data/tokenizer/qwen3";
  uint64_t seed = 1;
  bool log_steps = false;
  std::string json_path;
  std::string note;  // written into the JSON (the machine, its load)
  int logprobs = -1;  // --logprobs: the top logprobs every request asks for (-1: none)
};

EngineBenchOptions parse(int argc, char** argv) {
  const Args args(argc, argv,
                  {"preset", "batch", "context", "steps", "warmup", "sms", "policy", "block-size", "device-us", "stop",
                   "tokenizer", "seed", "json", "note", "logprobs"},
                  {"fresh-plan", "no-overlap", "ragged", "no-stop", "log-steps", "host-logprobs", "help"});
  EngineBenchOptions o;
  if (args.flag("help")) {
    std::fputs(kUsage, stdout);
    std::exit(0);
  }
  o.preset = args.get("preset", o.preset);
  o.batches.clear();
  for (int64_t b : args.get_int_list("batch", {1, 8, 64, 256})) {
    MD_REQUIRE(b >= 1 && b <= 4096, "--batch sizes must be in [1, 4096], got ", b);
    o.batches.push_back(static_cast<int>(b));
  }
  o.context = args.get_int32("context", o.context);
  o.steps = args.get_int32("steps", o.steps);
  o.warmup = args.get_int32("warmup", o.warmup);
  o.block_size = args.get_int32("block-size", o.block_size);
  o.null.n_sms = args.get_int32("sms", o.null.n_sms);
  o.null.policy = args.get("policy", o.null.policy);
  o.null.patch_plan = !args.flag("fresh-plan");
  o.null.device_us = args.get_double("device-us", 0.0);
  o.overlap = !args.flag("no-overlap");
  o.ragged = args.flag("ragged");
  if (args.flag("no-stop")) o.stop.clear();
  if (args.has("stop")) o.stop = {args.get("stop", "")};
  o.tokenizer_dir = args.get("tokenizer", o.tokenizer_dir);
  o.seed = static_cast<uint64_t>(args.get_int("seed", 1));
  o.log_steps = args.flag("log-steps");
  o.json_path = args.get("json", "");
  o.note = args.get("note", "");
  o.logprobs = args.get_int32("logprobs", -1);
  MD_REQUIRE(o.logprobs >= -1 && o.logprobs <= 20, "--logprobs must be in [0, 20], got ", o.logprobs);
  MD_REQUIRE(!args.flag("host-logprobs") || o.logprobs >= 0, "--host-logprobs needs --logprobs");
  if (args.flag("host-logprobs")) o.null.device_logprobs = -1;
  MD_REQUIRE(o.context >= 2, "--context must be at least 2, got ", o.context);
  MD_REQUIRE(o.steps >= 1 && o.warmup >= 0, "--steps must be >= 1 and --warmup >= 0");
  MD_REQUIRE(o.null.n_sms >= 1 && o.null.n_sms <= 4096, "--sms must be in [1, 4096], got ", o.null.n_sms);
  MD_REQUIRE(o.null.device_us >= 0.0, "--device-us must be >= 0");
  return o;
}

// Times the detokenizer inside output processing (its share of the output phase).
class TimedDecoder : public TextDecoder {
 public:
  TimedDecoder(std::unique_ptr<TextDecoder> inner, double* seconds) : inner_(std::move(inner)), seconds_(seconds) {}
  std::string push(int32_t token) override {
    const Stopwatch t;
    std::string s = inner_->push(token);
    *seconds_ += t.seconds();
    return s;
  }
  std::string flush() override { return inner_->flush(); }

 private:
  std::unique_ptr<TextDecoder> inner_;
  double* seconds_;
};

// What the server's sink does on the scheduler thread, minus the post to a connection: take the
// event and let it go.
class CountingSink : public OutputSink {
 public:
  void on_output(SeqOutput&& o) override {
    n_tokens += o.tokens.size();
    n_bytes += o.text.size();
    if (o.finished) reasons.push_back(o.finish_reason);
  }
  uint64_t n_tokens = 0, n_bytes = 0;
  std::vector<FinishReason> reasons;
};

struct BatchResult {
  int batch = 0;
  double steps_per_s = 0.0;
  StepTimes mean;  // per measured iteration
  double detok_s = 0.0;
  uint64_t n_chained = 0;
  StepPlanner::Counts plans;
};

BatchResult run_batch(const EngineBenchOptions& o, const ModelConfig& config, const Tokenizer& tokenizer,
                      const std::vector<int32_t>& cycle, int batch) {
  const int total = o.context + o.warmup + o.steps + 4;
  MD_REQUIRE(total <= config.max_position_embeddings, "--context + --warmup + --steps exceeds the model's ",
             config.max_position_embeddings, " positions");
  BackendOptions bo;
  bo.backend = "null";
  bo.kv_block_size = o.block_size;
  bo.n_kv_blocks = batch * ((total + o.block_size - 1) / o.block_size) + batch;
  NullBackendOptions null = o.null;
  null.token_cycle = cycle;
  NullBackend backend(config, bo, null);
  SchedulerConfig sc;
  sc.max_num_seqs = batch;
  sc.max_prefill_tokens = batch * o.context;
  sc.overlap = o.overlap ? Overlap::kAuto : Overlap::kOff;
  sc.log_steps = o.log_steps;
  double detok_s = 0.0;
  const TextDecoderFactory inner = streaming_decoders(tokenizer);
  TextDecoderFactory timed = [&](bool skip) { return std::make_unique<TimedDecoder>(inner(skip), &detok_s); };
  Scheduler sched(backend, sc, timed, nullptr);
  auto sink = std::make_shared<CountingSink>();
  SplitMix64 rng(o.seed + static_cast<uint64_t>(batch));
  for (int i = 0; i < batch; ++i) {
    SequenceRequest r;
    r.request_id = static_cast<uint64_t>(i + 1);
    const size_t at = rng.below(cycle.size());
    const int n_prompt = o.ragged ? o.context / 2 + static_cast<int>(rng.below(o.context - o.context / 2)) : o.context - 1;
    for (int k = 0; k < n_prompt; ++k) r.prompt.push_back(cycle[(at + static_cast<size_t>(k)) % cycle.size()]);
    r.sampling.temperature = 0.6f;  // Qwen3's generation_config.json (the device samples)
    r.sampling.top_p = 0.95f;
    r.sampling.top_k = 20;
    r.stop.max_tokens = o.warmup + o.steps + 2;
    r.stop.ignore_eos = true;  // the text has special tokens; every sequence runs the whole bench
    r.stop.stop = o.stop;
    r.logprobs = o.logprobs;
    r.sink = sink;
    sched.add(std::move(r));
  }
  sched.step();  // admission, prefill, the first launch
  MD_CHECK(sched.n_running() == batch && sched.n_waiting() == 0, "bench engine: the batch did not start whole");
  for (int i = 0; i < o.warmup; ++i) sched.step();
  BatchResult r;
  r.batch = batch;
  detok_s = 0.0;
  const uint64_t chained0 = sched.n_chained();
  StepTimes sum;
  const Stopwatch wall;
  for (int i = 0; i < o.steps; ++i) {
    sched.step();
    const StepTimes& t = sched.last_step();
    MD_CHECK(t.n_processed == batch, "bench engine: step ", t.step, " processed ", t.n_processed, " rows of ", batch);
    sum.schedule_s += t.schedule_s;
    sum.plan_s += t.plan_s;
    sum.stage_s += t.stage_s;
    sum.launch_s += t.launch_s;
    sum.output_s += t.output_s;
    sum.wait_s += t.wait_s;
  }
  const double seconds = wall.seconds();
  r.steps_per_s = o.steps / seconds;
  const double n = o.steps;
  r.mean.schedule_s = sum.schedule_s / n;
  r.mean.plan_s = sum.plan_s / n;
  r.mean.stage_s = sum.stage_s / n;
  r.mean.launch_s = sum.launch_s / n;
  r.mean.output_s = sum.output_s / n;
  r.mean.wait_s = sum.wait_s / n;
  r.detok_s = detok_s / n;
  r.n_chained = sched.n_chained() - chained0;
  r.plans = backend.plan_counts();
  while (sched.step()) {
  }
  MD_CHECK(sched.kv().n_used() == 0, "bench engine: KV blocks left after the run");
  MD_CHECK(static_cast<int>(sink->reasons.size()) == batch, "bench engine: ", sink->reasons.size(), " of ", batch,
           " sequences finished");
  for (FinishReason f : sink->reasons)
    MD_REQUIRE(f == FinishReason::kLength, "bench engine: a sequence ended before max_tokens (a stop string in the "
               "text?): the measured steps would not all have the whole batch");
  return r;
}

}  // namespace

int bench_engine(int argc, char** argv) {
  const EngineBenchOptions o = parse(argc, argv);
  const ModelConfig config = preset_config(o.preset);
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::load(o.tokenizer_dir);
  // The returned tokens: mixed text (prose, code, CJK, emoji, numbers), as the tokenizer cuts it.
  const std::vector<int32_t> cycle = tokenizer->encode(sample_text::mixed_text(o.seed, 1 << 16), false);
  MD_REQUIRE(!cycle.empty(), "bench engine: the sample text encodes to nothing");
  std::printf("engine benchmark: %s, context %s%d, %d steps after %d, %d SMs, plan %s, overlap %s, device %.0f us, "
              "%u host threads%s\n",
              o.preset.c_str(), o.ragged ? "up to " : "", o.context, o.steps, o.warmup, o.null.n_sms,
              o.null.patch_plan ? "patched" : "fresh", o.overlap ? "on" : "off", o.null.device_us,
              std::thread::hardware_concurrency(),
              o.logprobs < 0 ? ""
                             : cat(", logprobs ", o.logprobs, o.null.device_logprobs < 0 ? " (host)" : " (device)").c_str());
  std::printf("  %6s %10s %10s | %9s %9s %9s %9s %9s | %9s %9s | %s\n", "batch", "steps/s", "host us", "schedule",
              "plan", "stage", "launch", "output", "detok", "wait", "plans patched/reassembled/new, chained");
  nlohmann::json records = nlohmann::json::array();
  for (int b : o.batches) {
    const BatchResult r = run_batch(o, config, *tokenizer, cycle, b);
    const StepTimes& m = r.mean;
    std::printf("  %6d %10.1f %10.1f | %9.1f %9.1f %9.1f %9.1f %9.1f | %9.1f %9.1f | %llu/%llu/%llu, %llu\n", b,
                r.steps_per_s, m.host_s() * 1e6, m.schedule_s * 1e6, m.plan_s * 1e6, m.stage_s * 1e6,
                m.launch_s * 1e6, m.output_s * 1e6, r.detok_s * 1e6, m.wait_s * 1e6,
                static_cast<unsigned long long>(r.plans.patched), static_cast<unsigned long long>(r.plans.reassembled),
                static_cast<unsigned long long>(r.plans.new_skeletons), static_cast<unsigned long long>(r.n_chained));
    records.push_back({{"batch", b},
                       {"steps_per_s", r.steps_per_s},
                       {"host_us_per_step", m.host_s() * 1e6},
                       {"schedule_us", m.schedule_s * 1e6},
                       {"plan_us", m.plan_s * 1e6},
                       {"stage_us", m.stage_s * 1e6},
                       {"launch_us", m.launch_s * 1e6},
                       {"output_us", m.output_s * 1e6},
                       {"detok_us", r.detok_s * 1e6},
                       {"wait_us", m.wait_s * 1e6},
                       {"steps_chained", r.n_chained},
                       {"plans_patched", r.plans.patched},
                       {"plans_reassembled", r.plans.reassembled}});
  }
  if (!o.json_path.empty()) {
    std::string command = "megadecode bench engine";
    for (int i = 0; i < argc; ++i) command += std::string(" ") + argv[i];
    const nlohmann::json j = {{"benchmark", "engine"},
                              {"command", command},
                              {"preset", o.preset},
                              {"context", o.context},
                              {"steps", o.steps},
                              {"warmup", o.warmup},
                              {"sms", o.null.n_sms},
                              {"plan", o.null.patch_plan ? "patched" : "fresh"},
                              {"overlap", o.overlap},
                              {"ragged", o.ragged},
                              {"device_us", o.null.device_us},
                              {"logprobs", o.logprobs},
                              {"logprobs_on", o.null.device_logprobs < 0 ? "host" : "device"},
                              {"host_threads", std::thread::hardware_concurrency()},
                              {"note", o.note},
                              {"records", records}};
    write_json(o.json_path, j);
  }
  return 0;
}

}  // namespace megadecode
