// Prometheus text exposition of EngineMetrics (names: vLLM's, prefixed megadecode:).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "engine/metrics.h"
#include "engine/request.h"
#include "server/openai_service.h"

namespace megadecode {

namespace {

// The shortest of %.15g and %.17g that reads back as v (bucket bounds such as 1e-06 print so).
std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  if (std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string escape_label(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

struct Writer {
  std::string out;
  std::string labels;  // model_name="..."
  void head(const char* name, const char* type, const char* help) {
    out += std::string("# HELP megadecode:") + name + " " + help + "\n# TYPE megadecode:" + name + " " + type + "\n";
  }
  void sample(const std::string& name, double v, const std::string& extra = "") {
    out += "megadecode:" + name + "{" + labels + extra + "} " + number(v) + "\n";
  }
  void gauge(const char* name, const char* help, double v) {
    head(name, "gauge", help);
    sample(name, v);
  }
  void counter(const char* name, const char* help, double v) {
    head(name, "counter", help);
    sample(std::string(name), v);
  }
  void histogram(const char* name, const char* help, const Histogram& h) {
    head(name, "histogram", help);
    histogram_samples(name, h, "");
  }
  // One labelled member of a histogram family (extra: ",phase=\"plan\"").
  void histogram_samples(const char* name, const Histogram& h, const std::string& extra) {
    Histogram::Snapshot s = h.snapshot();
    for (size_t i = 0; i < s.upper_bounds.size(); ++i)
      sample(std::string(name) + "_bucket", static_cast<double>(s.cumulative[i]),
             extra + ",le=\"" + number(s.upper_bounds[i]) + "\"");
    sample(std::string(name) + "_bucket", static_cast<double>(s.cumulative.back()), extra + ",le=\"+Inf\"");
    sample(std::string(name) + "_sum", s.sum, extra);
    sample(std::string(name) + "_count", static_cast<double>(s.count), extra);
  }
};

}  // namespace

std::string render_metrics(EngineMetrics& m, const std::string& model_name) {
  Writer w;
  w.labels = "model_name=\"" + escape_label(model_name) + "\"";
  w.gauge("num_requests_running", "Sequences in the decode batch.", m.n_running.load());
  w.gauge("num_requests_waiting", "Sequences waiting for admission.", m.n_waiting.load());
  const int total = m.kv_blocks_total.load();
  const int used = m.kv_blocks_used.load();
  w.gauge("kv_cache_usage_perc", "Fraction of KV blocks held by sequences (1 = full).",
          total > 0 ? static_cast<double>(used) / total : 0.0);
  w.gauge("kv_cache_blocks_used", "KV blocks held by sequences.", used);
  w.gauge("kv_cache_blocks_total", "KV blocks in the pool.", total);
  // Per layer type: the full-attention layers' pool (the blocks above) and the
  // sliding-window layers' ring pool (0 for a model without sliding layers).
  w.head("kv_cache_blocks_used_by_layer_type", "gauge", "KV blocks held by sequences, by the layer type whose K/V they hold.");
  w.sample("kv_cache_blocks_used_by_layer_type", used, ",layer_type=\"full\"");
  w.sample("kv_cache_blocks_used_by_layer_type", m.kv_ring_blocks_used.load(), ",layer_type=\"sliding\"");
  w.head("kv_cache_blocks_total_by_layer_type", "gauge", "KV blocks in the pool of each layer type.");
  w.sample("kv_cache_blocks_total_by_layer_type", total, ",layer_type=\"full\"");
  w.sample("kv_cache_blocks_total_by_layer_type", m.kv_ring_blocks_total.load(), ",layer_type=\"sliding\"");
  w.counter("prompt_tokens_total", "Prompt tokens of requests that produced a first token.",
            static_cast<double>(m.prompt_tokens.load()));
  w.counter("generation_tokens_total", "Generated tokens.", static_cast<double>(m.generation_tokens.load()));
  w.counter("num_preemptions_total", "Sequences preempted (recomputed later) for lack of KV blocks.",
            static_cast<double>(m.preemptions.load()));
  w.counter("prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
            static_cast<double>(m.prefix_cache_queries.load()));
  w.counter("prefix_cache_hits_total", "Prompt tokens served from the prefix cache.",
            static_cast<double>(m.prefix_cache_hits.load()));
  w.counter("request_rejected_total", "Requests refused with 503 because the waiting queue was full.",
            static_cast<double>(m.rejected_queue_full.load()));
  w.head("request_success_total", "counter", "Finished sequences by finish reason.");
  for (FinishReason r : {FinishReason::kStop, FinishReason::kLength, FinishReason::kAbort, FinishReason::kError})
    w.sample("request_success_total", static_cast<double>(m.finished[static_cast<size_t>(r)].load()),
             std::string(",finished_reason=\"") + finish_reason_name(r) + "\"");
  w.histogram("time_to_first_token_seconds", "Time from arrival to the first generated token.", m.time_to_first_token);
  w.histogram("inter_token_latency_seconds", "Time between consecutive tokens of a sequence.", m.inter_token_latency);
  w.histogram("e2e_request_latency_seconds", "Time from arrival to the end of a sequence.", m.e2e_request_latency);
  w.histogram("request_queue_time_seconds",
              "Time from arrival to the first step that computes the request's tokens (admission, and prompts ahead of it).",
              m.request_queue_time);
  w.histogram("request_prefill_time_seconds", "Time from the request's first computed step to its first token.",
              m.request_prefill_time);
  w.histogram("request_prompt_tokens", "Prompt length of finished sequences.", m.request_prompt_tokens);
  w.histogram("request_generation_tokens", "Generated tokens of finished sequences.", m.request_generation_tokens);
  w.head("engine_step_seconds", "histogram",
         "Per scheduler iteration: host time by phase (schedule, plan, stage, launch, output; host = their sum) "
         "and the wait for the device.");
  const std::pair<const char*, const Histogram*> phases[] = {
      {"schedule", &m.step_schedule}, {"plan", &m.step_plan}, {"stage", &m.step_stage}, {"launch", &m.step_launch},
      {"output", &m.step_output},     {"host", &m.step_host}, {"wait", &m.step_wait}};
  for (const auto& [phase, h] : phases)
    w.histogram_samples("engine_step_seconds", *h, std::string(",phase=\"") + phase + "\"");
  return w.out;
}

}  // namespace megadecode
