// `megadecode bench serve`: an HTTP load generator for a running server (vLLM's `bench serve`
// metrics): sends --num-prompts streaming requests of random token-id prompts (--input-len tokens,
// --output-len tokens with ignore_eos), at most --concurrency in flight, arriving as a Poisson
// process at --request-rate (inf: all at once). Reports throughput, TTFT, TPOT, ITL and E2E
// latency (mean, median, p99), and the mean per-request decode rate, as a table and, with
// --json FILE, as JSON. With --background-streams N it measures decode stalls instead
// (serve_stall.h); with --agent N, conversations re-sending their history (serve_agent.h).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "bench/serve_agent.h"
#include "bench/serve_client.h"
#include "bench/serve_stall.h"
#include "core/args.h"
#include "core/check.h"
#include "core/json_file.h"
#include "core/rng.h"

namespace megadecode {
namespace {

using namespace serve_bench;
using nlohmann::json;

std::string served_model_name(const Args& args, const Target& target) {
  std::string model = args.get("model", "");
  if (!model.empty()) return model;
  json models = json::parse(http_get(target, "/v1/models"), nullptr, false);
  MD_REQUIRE(!models.is_discarded() && models.contains("data") && models["data"].is_array() && !models["data"].empty() &&
                 models["data"][0].contains("id") && models["data"][0]["id"].is_string(),
             "bench serve: GET /v1/models did not name a model; pass --model");
  return models["data"][0]["id"];
}

int int_arg(const Args& args, const char* name, int64_t fallback) {
  const int64_t v = args.get_int(name, fallback);
  MD_REQUIRE(v >= 1 && v <= (int64_t{1} << 30), "bench serve: --", name, " must be in [1, 2^30], got ", v);
  return static_cast<int>(v);
}

int bench_stall(const Args& args, const Target& target) {
  StallOptions o;
  o.model = served_model_name(args, target);
  o.n_streams = int_arg(args, "background-streams", 8);
  o.stream_input_len = int_arg(args, "input-len", o.stream_input_len);
  o.stream_output_len = int_arg(args, "output-len", o.stream_output_len);
  o.long_prompt_len = int_arg(args, "long-prompt-len", o.long_prompt_len);
  o.before_tokens = int_arg(args, "before-tokens", o.before_tokens);
  o.timeout_s = args.get_double("timeout", o.timeout_s);
  o.vocab = int_arg(args, "vocab", o.vocab);
  o.seed = static_cast<uint64_t>(args.get_int("seed", 0));
  const StallReport report = run_stall(target, o);
  print_stall(o, report);
  if (args.has("json")) write_json(args.get("json", ""), stall_json(o, report));
  return report.complete ? 0 : 1;
}

int bench_agent(const Args& args, const Target& target) {
  AgentOptions o;
  o.model = served_model_name(args, target);
  o.n_conversations = int_arg(args, "agent", o.n_conversations);
  o.turns = int_arg(args, "turns", o.turns);
  o.prefix_len = int_arg(args, "prefix-len", o.prefix_len);
  o.append_min = int_arg(args, "append-min", o.append_min);
  o.append_max = int_arg(args, "append-max", o.append_max);
  o.output_len = int_arg(args, "output-len", o.output_len);
  o.timeout_s = args.get_double("timeout", 0);
  o.vocab = int_arg(args, "vocab", o.vocab);
  o.seed = static_cast<uint64_t>(args.get_int("seed", 0));
  MD_REQUIRE(o.timeout_s >= 0.0, "--timeout must be positive (seconds) or 0 for none");
  const AgentReport report = run_agent(target, o);
  print_agent(o, report);
  if (args.has("json")) write_json(args.get("json", ""), agent_json(o, report));
  return report.complete ? 0 : 1;
}

}  // namespace

constexpr const char* kUsage =
    "usage: megadecode bench serve [--url http://127.0.0.1:8000] [--model NAME (from /v1/models)]\n"
    "         [--endpoint completions|chat] [--num-prompts N (200)] [--concurrency N (16)] [--request-rate R (inf)]\n"
    "         [--input-len N (128)] [--output-len N (128)] [--vocab N (1000)] [--seed S] [--timeout S] [--json FILE]\n"
    "         [--response-format json_object|SCHEMA.json (every request constrained; the server needs a tokenizer)]\n"
    "         [--output-lens FILE (request i asks for entry i of a run's output_tokens_each, not --output-len)]\n"
    "       megadecode bench serve --background-streams N [--long-prompt-len N] [--before-tokens N] ...\n"
    "       megadecode bench serve --agent N [--turns T (8)] [--prefix-len N (6144)] [--append-min N (300)]\n"
    "         [--append-max N (800)] [--output-len N (200)] ...\n"
    "  Streams random token-id prompts (ignore_eos) and reports throughput, TTFT, TPOT, ITL and E2E latency;\n"
    "  with --background-streams it measures the decode stall a long prompt causes in running streams;\n"
    "  with --agent, N conversations that re-send their growing history every turn (the prefix cache).\n"
    "  --output-lens: the JSON of an earlier run (its output_tokens_each) or a list of lengths, one a prompt: an\n"
    "  unconstrained run then does the work a constrained one did (its requests end when their grammar does).\n";

namespace {

// --output-lens FILE: one length a prompt, from a bench serve JSON (output_tokens_each) or a list.
std::vector<int> read_output_lens(const std::string& path, int n_prompts) {
  std::ifstream in(path);
  MD_REQUIRE(in.good(), "bench serve: --output-lens: cannot read \"", path, "\"");
  json j = json::parse(in, nullptr, false);
  if (j.is_object() && j.contains("output_tokens_each")) j = j["output_tokens_each"];
  MD_REQUIRE(j.is_array(), "bench serve: --output-lens: \"", path, "\" holds neither a list nor output_tokens_each");
  MD_REQUIRE(static_cast<int>(j.size()) == n_prompts, "bench serve: --output-lens: \"", path, "\" has ", j.size(),
             " lengths for ", n_prompts, " prompts");
  std::vector<int> lens;
  for (size_t i = 0; i < j.size(); ++i) {
    MD_REQUIRE(j[i].is_number_integer() && j[i].get<int64_t>() >= 1 && j[i].get<int64_t>() <= (1 << 24),
               "bench serve: --output-lens: entry ", i, " of \"", path, "\" is ", j[i].dump(),
               ", not a length (a request of that run failed, or the file is not a run's)");
    lens.push_back(j[i].get<int>());
  }
  return lens;
}

}  // namespace

int bench_serve(int argc, char** argv) {
  Args args(argc, argv,
            {"url", "model", "endpoint", "num-prompts", "concurrency", "request-rate", "input-len", "output-len",
             "seed", "json", "vocab", "timeout", "background-streams", "long-prompt-len", "before-tokens", "agent", "turns",
             "prefix-len", "append-min", "append-max", "response-format", "output-lens"},
            {"help"});
  if (args.flag("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const Target target = parse_url(args.get("url", "http://127.0.0.1:8000"));
  MD_REQUIRE(!(args.has("background-streams") && args.has("agent")), "bench serve: --background-streams or --agent, not both");
  if (args.has("background-streams")) return bench_stall(args, target);
  if (args.has("agent")) return bench_agent(args, target);
  MD_REQUIRE(!args.has("long-prompt-len") && !args.has("before-tokens"),
             "bench serve: --long-prompt-len and --before-tokens need --background-streams N");
  for (const char* a : {"turns", "prefix-len", "append-min", "append-max"})
    MD_REQUIRE(!args.has(a), "bench serve: --", a, " needs --agent N");
  // --response-format json_object, or a JSON Schema file: every completion request is constrained.
  json response_format = nullptr;
  if (args.has("response-format")) {
    const std::string rf = args.get("response-format", "");
    if (rf == "json_object") {
      response_format = {{"type", "json_object"}};
    } else {
      std::ifstream in(rf);
      MD_REQUIRE(in.good(), "bench serve: --response-format: cannot read \"", rf, "\" (json_object or a schema file)");
      const json schema = json::parse(in, nullptr, false);
      MD_REQUIRE(schema.is_object(), "bench serve: --response-format: \"", rf, "\" holds no JSON Schema object");
      response_format = {{"type", "json_schema"}, {"json_schema", {{"name", "bench"}, {"schema", schema}}}};
    }
  }
  const int n_prompts = int_arg(args, "num-prompts", 200);
  const int concurrency = int_arg(args, "concurrency", 16);
  const double rate = args.has("request-rate") && args.get("request-rate", "inf") != "inf" ? args.get_double("request-rate", 0) : 0.0;
  const int input_len = int_arg(args, "input-len", 128);
  const int output_len = int_arg(args, "output-len", 128);
  MD_REQUIRE(!(args.has("output-lens") && args.has("output-len")), "bench serve: --output-len or --output-lens, not both");
  const std::vector<int> output_lens = args.has("output-lens") ? read_output_lens(args.get("output-lens", ""), n_prompts)
                                                                : std::vector<int>(n_prompts, output_len);
  const double timeout_s = args.get_double("timeout", 0);  // 0: none
  const std::string endpoint = args.get("endpoint", "completions");
  MD_REQUIRE(endpoint == "completions" || endpoint == "chat", "--endpoint must be completions or chat");
  MD_REQUIRE(response_format.is_null() || endpoint == "completions", "--response-format goes with --endpoint completions");
  MD_REQUIRE(rate >= 0.0 && std::isfinite(rate), "--request-rate must be positive or inf");
  MD_REQUIRE(timeout_s >= 0.0, "--timeout must be positive (seconds) or 0 for none");
  const net::ip::address address = net::ip::make_address(target.host);
  const std::string model = served_model_name(args, target);

  // Random prompts: token ids from the low end of the vocabulary (every model has them); chat
  // prompts are random lowercase words instead (about one token each).
  const int vocab = int_arg(args, "vocab", 1000);
  SplitMix64 rng(static_cast<uint64_t>(args.get_int("seed", 0)));
  std::vector<std::string> requests;
  for (int i = 0; i < n_prompts; ++i) {
    if (endpoint == "completions") {
      requests.push_back(http_post(target, "/v1/completions",
                                   completion_body(model, random_prompt(rng, input_len, vocab), output_lens[i], response_format)));
      continue;
    }
    std::string text;
    for (int k = 0; k < input_len; ++k) text += std::string(k ? " " : "") + static_cast<char>('a' + rng.below(26));
    const json body = {{"model", model},     {"max_tokens", output_lens[i]},
                       {"ignore_eos", true}, {"stream", true},
                       {"temperature", 0.0}, {"stream_options", {{"include_usage", true}}},
                       {"messages", {{{"role", "user"}, {"content", text}}}}};
    requests.push_back(http_post(target, "/v1/chat/completions", body.dump()));
  }

  // Arrival times: Poisson at `rate`, or all at t = 0.
  std::vector<double> arrival(n_prompts, 0.0);
  for (int i = 1; i < n_prompts && rate > 0.0; ++i) arrival[i] = arrival[i - 1] - std::log(1.0 - rng.unit()) / rate;

  net::io_context ioc;
  const tcp::endpoint ep(address, static_cast<unsigned short>(target.port));
  std::vector<RequestRecord> records(n_prompts);
  std::vector<std::shared_ptr<BenchRequest>> in_flight_reqs(n_prompts);
  const auto t0 = BenchClock::now();
  int next = 0, in_flight = 0;
  bool timed_out = false;
  net::steady_timer timer(ioc), deadline(ioc);
  std::function<void()> pump = [&] {
    while (!timed_out && next < n_prompts && in_flight < concurrency) {
      const double due = arrival[next];
      const double elapsed = std::chrono::duration<double>(BenchClock::now() - t0).count();
      if (due > elapsed) {
        timer.expires_after(std::chrono::duration_cast<BenchClock::duration>(std::chrono::duration<double>(due - elapsed)));
        timer.async_wait([&](boost::system::error_code ec) {
          if (!ec) pump();
        });
        return;
      }
      ++in_flight;
      const int i = next++;
      in_flight_reqs[i] = std::make_shared<BenchRequest>(ioc, ep, requests[i], records[i], t0, nullptr, [&, i] {
        --in_flight;
        in_flight_reqs[i].reset();
        if (in_flight == 0 && next == n_prompts) deadline.cancel();
        pump();
      });
      in_flight_reqs[i]->start();
    }
  };
  if (timeout_s > 0) {
    deadline.expires_after(std::chrono::duration_cast<BenchClock::duration>(std::chrono::duration<double>(timeout_s)));
    deadline.async_wait([&](boost::system::error_code ec) {
      if (ec) return;
      timed_out = true;  // no more sends; what is in flight is cancelled and counts as failed
      timer.cancel();
      for (std::shared_ptr<BenchRequest> r : in_flight_reqs)  // copies: done() resets the slot
        if (r) r->cancel();
    });
  }
  pump();
  ioc.run();
  const double duration = std::chrono::duration<double>(BenchClock::now() - t0).count();

  std::vector<double> ttft, tpot, itl, e2e, decode_rate;
  int completed = 0, failed = 0;
  long long total_out = 0;
  std::string first_error;
  json each = json::array();  // output tokens of request i (-1: failed)
  for (int i = 0; i < n_prompts; ++i) {
    const RequestRecord& r = records[i];
    each.push_back(r.ok ? r.output_tokens : -1);
    if (!r.ok) {
      ++failed;
      if (first_error.empty()) first_error = i >= next ? "not sent before --timeout" : r.cancelled ? "cancelled at --timeout" : r.error;
      continue;
    }
    ++completed;
    total_out += r.output_tokens;
    ttft.push_back(r.first_token - r.send);
    e2e.push_back(r.end - r.send);
    if (r.output_tokens > 1 && r.end > r.first_token) {
      tpot.push_back((r.end - r.first_token) / (r.output_tokens - 1));
      decode_rate.push_back((r.output_tokens - 1) / (r.end - r.first_token));  // this request's decode tok/s
    }
    for (size_t k = 1; k < r.chunk_times.size(); ++k) itl.push_back(r.chunk_times[k] - r.chunk_times[k - 1]);
  }
  const Summary s_ttft = summarize(ttft), s_tpot = summarize(tpot), s_itl = summarize(itl), s_e2e = summarize(e2e);
  const Summary s_rate = summarize(decode_rate);
  char rate_text[32] = "inf";
  if (rate > 0) std::snprintf(rate_text, sizeof rate_text, "%g/s", rate);
  const std::string out_text = args.has("output-lens") ? cat("lengths of ", args.get("output-lens", "")) : cat(output_len);
  std::printf("bench serve: %s, %d prompts (%d in / %s out tokens), concurrency %d, rate %s\n", model.c_str(),
              n_prompts, input_len, out_text.c_str(), concurrency, rate_text);
  std::printf("  completed %d, failed %d%s%s\n", completed, failed, first_error.empty() ? "" : " (first error: ",
              first_error.empty() ? "" : (first_error + ")").c_str());
  std::printf("  duration %.3f s, %.2f req/s, %.1f output tok/s, %.1f decode tok/s per request (mean)\n", duration,
              completed / duration, total_out / duration, s_rate.mean);
  std::printf("  %-6s %10s %10s %10s %10s  (ms)\n", "", "mean", "median", "p99", "max");
  for (auto [name, s] : {std::pair{"TTFT", s_ttft}, std::pair{"TPOT", s_tpot}, std::pair{"ITL", s_itl}, std::pair{"E2EL", s_e2e}})
    std::printf("  %-6s %10.2f %10.2f %10.2f %10.2f\n", name, s.mean * 1e3, s.median * 1e3, s.p99 * 1e3, s.max * 1e3);

  if (args.has("json")) {
    auto ms = [](const Summary& s) {
      return json{{"mean_ms", s.mean * 1e3}, {"median_ms", s.median * 1e3}, {"p99_ms", s.p99 * 1e3}, {"max_ms", s.max * 1e3}};
    };
    json out = {{"model", model},          {"endpoint", endpoint},       {"num_prompts", n_prompts},
                {"concurrency", concurrency}, {"request_rate", rate > 0 ? json(rate) : json("inf")},
                {"input_len", input_len},  {"output_len", args.has("output-lens") ? -1 : output_len},   {"completed", completed},
                {"failed", failed},        {"duration_s", duration},     {"request_throughput", completed / duration},
                {"output_token_throughput", total_out / duration},       {"total_output_tokens", total_out},
                {"ttft", ms(s_ttft)},      {"tpot", ms(s_tpot)},         {"itl", ms(s_itl)},
                {"e2el", ms(s_e2e)},       {"decode_tok_s_per_request", {{"mean", s_rate.mean}, {"median", s_rate.median}}},
                {"output_tokens_each", each}, {"output_lens_from", args.get("output-lens", "")}};
    write_json(args.get("json", ""), out);
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace megadecode
