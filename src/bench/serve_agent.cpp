// Scenario g, "agent" (see serve_agent.h).
#include "bench/serve_agent.h"

#include <cstdio>
#include <functional>
#include <memory>

#include "core/check.h"

namespace megadecode::serve_bench {

namespace {

using nlohmann::json;

// One conversation: its history so far and the request in flight.
struct Conversation {
  std::vector<int32_t> history;  // the earlier turns: appended tokens, then the output's
  int turn = 0;
  RequestRecord record;
  std::shared_ptr<BenchRequest> request;
};

}  // namespace

AgentReport run_agent(const Target& target, const AgentOptions& o) {
  MD_REQUIRE(o.n_conversations >= 1 && o.turns >= 1 && o.prefix_len >= 1 && o.output_len >= 1 && o.vocab >= 1,
             "bench serve --agent: conversations, turns, prefix, output length and vocabulary must be positive");
  MD_REQUIRE(o.append_min >= 1 && o.append_max >= o.append_min, "bench serve --agent: --append-min ", o.append_min,
             " and --append-max ", o.append_max, " must satisfy 1 <= min <= max");
  SplitMix64 rng(o.seed);
  const std::vector<int32_t> prefix = random_prompt(rng, o.prefix_len, o.vocab);
  const tcp::endpoint ep(net::ip::make_address(target.host), static_cast<unsigned short>(target.port));
  net::io_context ioc;
  std::vector<Conversation> convs(static_cast<size_t>(o.n_conversations));
  AgentReport report;
  const auto t0 = BenchClock::now();
  bool timed_out = false;
  int active = 0;
  net::steady_timer deadline(ioc);
  std::function<void(int)> send = [&](int c) {
    Conversation& conv = convs[static_cast<size_t>(c)];
    const int n_append = o.append_min + static_cast<int>(rng.below(static_cast<uint64_t>(o.append_max - o.append_min + 1)));
    const std::vector<int32_t> append = random_prompt(rng, n_append, o.vocab);
    std::vector<int32_t> prompt = prefix;
    prompt.insert(prompt.end(), conv.history.begin(), conv.history.end());
    prompt.insert(prompt.end(), append.begin(), append.end());
    conv.history.insert(conv.history.end(), append.begin(), append.end());
    conv.record = RequestRecord{};
    conv.request = std::make_shared<BenchRequest>(
        ioc, ep, http_post(target, "/v1/completions", completion_body(o.model, prompt, o.output_len)), conv.record, t0,
        nullptr, [&, c] {
          Conversation& cv = convs[static_cast<size_t>(c)];
          const RequestRecord& r = cv.record;
          AgentTurn t;
          t.conversation = c;
          t.turn = cv.turn;
          t.ok = r.ok;
          t.error = r.cancelled ? "cancelled at --timeout" : r.error;
          t.send = r.send;
          t.ttft = r.first_token >= 0 ? r.first_token - r.send : 0;
          t.e2e = r.end - r.send;
          t.prompt_tokens = r.prompt_tokens;
          t.cached_tokens = r.cached_tokens;
          t.output_tokens = r.output_tokens;
          t.ids_returned = static_cast<int>(r.token_ids.size()) == r.output_tokens && r.output_tokens > 0;
          report.turns.push_back(t);
          if (!t.ok && report.error.empty()) report.error = cat("conversation ", c, " turn ", cv.turn, ": ", t.error);
          // The output joins the history: its ids, or as many random ones where the server sent text.
          if (t.ids_returned) {
            cv.history.insert(cv.history.end(), r.token_ids.begin(), r.token_ids.end());
          } else {
            const std::vector<int32_t> stand_in = random_prompt(rng, r.output_tokens, o.vocab);
            cv.history.insert(cv.history.end(), stand_in.begin(), stand_in.end());
          }
          cv.request.reset();
          if (t.ok && !timed_out && ++cv.turn < o.turns) {
            send(c);
            return;
          }
          if (--active == 0) deadline.cancel();
        });
    conv.request->start();
  };
  if (o.timeout_s > 0) {
    deadline.expires_after(std::chrono::duration_cast<BenchClock::duration>(std::chrono::duration<double>(o.timeout_s)));
    deadline.async_wait([&](boost::system::error_code ec) {
      if (ec) return;
      timed_out = true;
      for (Conversation& cv : convs)
        if (std::shared_ptr<BenchRequest> r = cv.request) r->cancel();
    });
  }
  for (int c = 0; c < o.n_conversations; ++c) {
    ++active;
    send(c);
  }
  ioc.run();
  report.duration_s = std::chrono::duration<double>(BenchClock::now() - t0).count();

  std::vector<double> ttft, later;
  int n_ok = 0;
  for (const AgentTurn& t : report.turns) {
    if (!t.ok) continue;
    ++n_ok;
    ttft.push_back(t.ttft);
    if (t.turn > 0) later.push_back(t.ttft);
    report.prompt_tokens += t.prompt_tokens;
    report.cached_tokens += t.cached_tokens;
    report.output_tokens += t.output_tokens;
  }
  report.ttft = summarize(ttft);
  report.ttft_later = summarize(later);
  report.complete = n_ok == o.n_conversations * o.turns;
  if (!report.complete && report.error.empty())
    report.error = timed_out ? "not finished before --timeout" : "some turns did not run";
  return report;
}

json agent_json(const AgentOptions& o, const AgentReport& r) {
  auto ms = [](const Summary& s) {
    return json{{"mean", s.mean * 1e3}, {"p50", s.median * 1e3}, {"p99", s.p99 * 1e3}, {"max", s.max * 1e3}};
  };
  json turns = json::array();
  for (const AgentTurn& t : r.turns)
    turns.push_back({{"conversation", t.conversation}, {"turn", t.turn}, {"ok", t.ok}, {"ttft_ms", t.ttft * 1e3},
                     {"e2e_ms", t.e2e * 1e3}, {"prompt_tokens", t.prompt_tokens}, {"cached_tokens", t.cached_tokens},
                     {"output_tokens", t.output_tokens}, {"ids_returned", t.ids_returned}});
  json j = {{"mode", "agent"},
            {"model", o.model},
            {"conversations", o.n_conversations},
            {"turns", o.turns},
            {"prefix_len", o.prefix_len},
            {"append_min", o.append_min},
            {"append_max", o.append_max},
            {"output_len", o.output_len},
            {"complete", r.complete},
            {"duration_s", r.duration_s},
            {"ttft_ms", ms(r.ttft)},
            {"ttft_later_turns_ms", ms(r.ttft_later)},
            {"prompt_tokens", r.prompt_tokens},
            {"cached_tokens", r.cached_tokens},
            {"prefix_cache_hit_rate", r.hit_rate()},
            {"output_tokens", r.output_tokens},
            {"output_token_throughput", r.duration_s > 0 ? r.output_tokens / r.duration_s : 0.0},
            {"turn_records", turns}};
  if (!r.error.empty()) j["error"] = r.error;
  return j;
}

void print_agent(const AgentOptions& o, const AgentReport& r) {
  std::printf("bench serve --agent: %s, %d conversations x %d turns, prefix %d, +%d..%d tokens a turn, %d out\n",
              o.model.c_str(), o.n_conversations, o.turns, o.prefix_len, o.append_min, o.append_max, o.output_len);
  if (!r.complete) std::printf("  incomplete: %s\n", r.error.c_str());
  std::printf("  duration %.3f s, %.1f output tok/s, prefix-cache hit rate %.1f %% (%lld of %lld prompt tokens)\n",
              r.duration_s, r.duration_s > 0 ? r.output_tokens / r.duration_s : 0.0, 100.0 * r.hit_rate(),
              r.cached_tokens, r.prompt_tokens);
  std::printf("  TTFT ms: every turn p50 %.2f p99 %.2f; later turns p50 %.2f p99 %.2f\n", r.ttft.median * 1e3,
              r.ttft.p99 * 1e3, r.ttft_later.median * 1e3, r.ttft_later.p99 * 1e3);
}

}  // namespace megadecode::serve_bench
