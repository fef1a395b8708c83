// Scenario g, "agent", of `megadecode bench serve --agent N`: N conversations run at once, each one
// request at a time for --turns turns. Turn t's prompt is the --prefix-len tokens every
// conversation shares (a system prompt and tools), then the conversation's earlier turns (each its
// appended tokens and the tokens the server returned), then --append-min..--append-max new tokens
// (a user message or a tool result); it asks for --output-len tokens (ignore_eos). A coding agent
// re-sends its whole conversation every turn, so what this measures is the prefix cache: TTFT
// (every turn, and the turns after the first), the hit rate (usage.prompt_tokens_details.
// cached_tokens over prompt_tokens), and output tok/s. A server without a tokenizer returns token
// ids and the history holds them; one with text gives none back, and the history holds random ids
// of the same count in their place (the hit then ends where the previous output began).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/serve_client.h"

namespace megadecode::serve_bench {

struct AgentOptions {
  std::string model;
  int n_conversations = 16;
  int turns = 8;
  int prefix_len = 6144;
  int append_min = 300, append_max = 800;
  int output_len = 200;
  double timeout_s = 0;  // 0: none; past it what is in flight is cancelled and the run fails
  int vocab = 1000;
  uint64_t seed = 0;
};

struct AgentTurn {
  int conversation = 0, turn = 0;
  bool ok = false;
  std::string error;
  double send = 0, ttft = 0, e2e = 0;  // seconds
  int prompt_tokens = 0, cached_tokens = 0, output_tokens = 0;
  bool ids_returned = false;  // the server sent the output's token ids
};

struct AgentReport {
  bool complete = false;  // every turn of every conversation finished
  std::string error;      // the first failure
  double duration_s = 0;
  std::vector<AgentTurn> turns;  // in completion order
  Summary ttft, ttft_later;       // seconds: every turn; turns after each conversation's first
  long long prompt_tokens = 0, cached_tokens = 0, output_tokens = 0;
  double hit_rate() const { return prompt_tokens > 0 ? static_cast<double>(cached_tokens) / prompt_tokens : 0.0; }
};

// Runs the conversations against a server (blocking; bounded by options.timeout_s when set).
AgentReport run_agent(const Target& target, const AgentOptions& options);

nlohmann::json agent_json(const AgentOptions& options, const AgentReport& report);
void print_agent(const AgentOptions& options, const AgentReport& report);

}  // namespace megadecode::serve_bench
