// The server on the real path: the cpu-ref backend running the synthetic tiny qwen3_moe model that
// `megadecode make-model --preset tiny` writes, with its Qwen3 tokenizer and chat template.
// Temperature-0 output equals `megadecode generate` (the CLI, and its loop token for token, also
// under prefix caching, chunked prefill, preemption and a batch of neighbours), and the official
// openai npm client passes against it. Served without its tokenizer (--skip-tokenizer-init), the
// model returns the same tokens as ids, with the end tokens of its config files. `make-model
// --preset north-tiny` talks too: chat and streamed tool requests through its own tokenizer and
// cmd4 template.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <thread>

#include "cli/backend_factory.h"
#include "cli/generate_loop.h"
#include "model/loader.h"
#include "server/model_text.h"
#include "../structured/structured_test_util.h"
#include "server_fixture.h"
#include "tokenizer/chat_template.h"

namespace megadecode {
namespace {

namespace fs = std::filesystem;
const fs::path kRoot = MEGADECODE_SOURCE_DIR;

fs::path megadecode_binary() { return fs::read_symlink("/proc/self/exe").parent_path() / "megadecode"; }

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  std::array<char, 4096> buf{};
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
  const int rc = pclose(p);
  EXPECT_EQ(rc, 0) << cmd;
  return out;
}

// The model directory `make-model --preset PRESET --seed 0` writes.
fs::path make_model_dir(const std::string& preset) {
  const fs::path d = fs::temp_directory_path() / ("megadecode_" + preset + "_" + std::to_string(::getpid()));
  run("'" + megadecode_binary().string() + "' make-model --preset " + preset + " --seed 0 --out '" + d.string() +
      "' 2>&1");
  return d;
}

// The tiny model's directory, made once per process.
const fs::path& tiny_model_dir() {
  static const fs::path dir = make_model_dir("tiny");
  return dir;
}

// North Mini Code's structure at test size (cohere2_moe; the synthetic North tokenizer and the
// cmd4 template), made once per process.
const fs::path& north_tiny_model_dir() {
  static const fs::path dir = make_model_dir("north-tiny");
  return dir;
}

class TinyModelTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() {
    fs::remove_all(tiny_model_dir());
    fs::remove_all(north_tiny_model_dir());
  }
  void SetUp() override {
    ASSERT_TRUE(fs::exists(megadecode_binary())) << megadecode_binary() << " is not built";
    ASSERT_TRUE(fs::exists(tiny_model_dir() / "tokenizer.json")) << "make-model failed (run scripts/setup)";
  }
};

struct TinyStack {
  explicit TinyStack(int kv_blocks = 512, int block_size = 16, int max_num_seqs = 8, int chunk = 32,
                     bool with_tokenizer = true, const fs::path& model_dir = tiny_model_dir())
      : dir(model_dir) {
    model = std::make_shared<LoadedModel>(load_model(dir));
    if (with_tokenizer) tokenizer = Tokenizer::load(dir);
    backend = make_backend(model->config, model->weights, model,
                           BackendOptions{.kv_block_size = block_size, .n_kv_blocks = kv_blocks, .n_threads = 2});
    EngineConfig ec;
    ec.scheduler = SchedulerConfig{.max_num_seqs = max_num_seqs, .max_prefill_tokens = chunk, .check_invariants = true};
    ec.max_model_len = 1024;
    engine = std::make_unique<Engine>(*backend, ec, tokenizer ? streaming_decoders(*tokenizer) : no_text_decoders());
  }
  fs::path dir;
  std::shared_ptr<LoadedModel> model;
  std::unique_ptr<Tokenizer> tokenizer;  // null: as `serve --skip-tokenizer-init`
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Engine> engine;
};

ServedModel tiny_served_model(const TinyStack& stack, const ChatFlags& flags = {}) {
  return stack.tokenizer ? served_model(stack.dir, "tiny", stack.model->config, *stack.tokenizer, flags)
                         : served_model_without_tokenizer(stack.dir, "tiny", stack.model->config);
}

// TinyStack behind the HTTP server, as `megadecode serve` assembles it.
struct TinyServer {
  explicit TinyServer(bool with_tokenizer = true, const fs::path& dir = tiny_model_dir(), const ChatFlags& flags = {})
      : stack(512, 16, 8, 32, with_tokenizer, dir), service(*stack.engine, tiny_served_model(stack, flags)) {
    HttpServerConfig hc;
    hc.port = 0;
    http = std::make_unique<HttpServer>(hc, service.handler());
    stack.engine->start();
    http->start();
  }
  ~TinyServer() {
    http->stop();
    stack.engine->stop();
  }
  TinyStack stack;
  OpenAiService service;
  std::unique_ptr<HttpServer> http;
};

std::vector<int32_t> reference_generate(const LoadedModel& model, const std::vector<int32_t>& prompt, int max_tokens) {
  auto backend = make_backend(model.config, model.weights, nullptr,
                              BackendOptions{.kv_block_size = 16, .n_kv_blocks = 64, .n_threads = 2});
  GenerateRequest r;
  r.prompt = prompt;
  r.sampling.temperature = 0.0f;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return generate(*backend, r, nullptr).tokens;
}

TEST_F(TinyModelTest, GreedyEqualsGenerateLoopUnderBatchingCachingAndPreemption) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  // 12 blocks of 16 for 4 sequences of up to ~95 tokens: preemption is likely.
  TinyStack stack(/*kv_blocks=*/12, /*block_size=*/16, /*max_num_seqs=*/4, /*chunk=*/24);
  stack.engine->start();
  std::vector<int32_t> shared;
  for (int i = 0; i < 37; ++i) shared.push_back(static_cast<int32_t>(rng.below(151000)));
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p(shared.begin(), shared.begin() + static_cast<long>(rng.below(shared.size())));
    for (int k = 0, n = 1 + static_cast<int>(rng.below(40)); k < n; ++k) p.push_back(static_cast<int32_t>(rng.below(151000)));
    prompts.push_back(p);
  }
  auto sink = std::make_shared<testing::CollectingSink>();
  for (size_t i = 0; i < prompts.size(); ++i) {
    SequenceRequest s;
    s.request_id = i + 1;
    s.prompt = prompts[i];
    s.sampling.temperature = 0.0f;
    s.stop.max_tokens = 10 + static_cast<int>(i);
    s.stop.ignore_eos = true;
    s.sink = sink;
    ASSERT_EQ(stack.engine->submit({s}), SubmitStatus::kOk);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (;;) {
    size_t finished = 0;
    {
      std::lock_guard<std::mutex> lock(sink->mutex);
      for (const SeqOutput& e : sink->events) finished += e.finished;
    }
    if (finished == prompts.size()) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "generation did not finish";
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::map<uint64_t, std::vector<int32_t>> got;
  int cached = 0;
  for (const SeqOutput& e : sink->events) {
    got[e.request_id].insert(got[e.request_id].end(), e.tokens.begin(), e.tokens.end());
    if (e.finished) {
      EXPECT_EQ(e.finish_reason, FinishReason::kLength) << e.error;
      cached += e.n_cached_tokens;
    }
  }
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(got[i + 1], reference_generate(*stack.model, prompts[i], 10 + static_cast<int>(i))) << "prompt " << i;
  std::printf("prefix cache served %d prompt tokens, %llu preemptions\n", cached,
              static_cast<unsigned long long>(stack.engine->metrics().preemptions.load()));
  stack.engine->stop();
}

TEST_F(TinyModelTest, ServedTextEqualsGenerateCli) {
  TinyServer server;
  for (const std::string prompt : {"The capital of France is", "def fibonacci(n):", "Über 9000 ✓"}) {
    const std::string cli = run("'" + megadecode_binary().string() + "' generate --model '" + tiny_model_dir().string() +
                                "' --prompt '" + prompt + "' --temperature 0 --max-tokens 16 --ignore-eos 2>/dev/null");
    testing::HttpClient c(server.http->port());
    auto r = c.request("POST", "/v1/completions",
                       nlohmann::json{{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0},
                                      {"ignore_eos", true}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.json()["choices"][0]["text"].get<std::string>() + "\n", cli) << "prompt: " << prompt;
    EXPECT_EQ(r.json()["usage"]["completion_tokens"], 16);
  }
}

// North Mini Code's structure (cohere2_moe, north-tiny: a 24-key sliding window) served as token
// ids: prompts past the window, chunked prefill of 32 tokens, several requests at once (one batch);
// every reply equals the generate loop's on its own, and the end token comes from its config.
TEST_F(TinyModelTest, NorthTinyServedAsIdsPastItsWindowEqualsGenerate) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  TinyServer server(/*with_tokenizer=*/false, north_tiny_model_dir());
  ASSERT_EQ(server.stack.model->config.model_type, "cohere2_moe");
  EXPECT_EQ(tiny_served_model(server.stack).eos_token_ids, (std::vector<int32_t>{255001}));
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p;
    for (int k = 0, n = 20 + static_cast<int>(rng.below(50)); k < n; ++k)
      p.push_back(static_cast<int32_t>(rng.below(262144)));
    prompts.push_back(p);
  }
  std::vector<std::thread> clients;
  std::vector<std::vector<int32_t>> got(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    clients.emplace_back([&, i] {
      testing::HttpClient c(server.http->port());
      const nlohmann::json body = {{"model", "tiny"}, {"prompt", prompts[i]}, {"max_tokens", 14},
                                   {"temperature", 0}, {"ignore_eos", true}};
      auto r = c.request("POST", "/v1/completions", body.dump());
      if (r.status == 200) got[i] = r.json()["choices"][0]["token_ids"].get<std::vector<int32_t>>();
      else ADD_FAILURE() << r.status << " " << r.body;
    });
  }
  for (std::thread& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i].size(), 14u) << "prompt " << i;
    EXPECT_EQ(got[i], reference_generate(*server.stack.model, prompts[i], 14)) << "prompt " << i;
  }
}

// The North checkpoint make-model writes talks with nothing added: its tokenizer.json and the cmd4
// template in tokenizer_config.json, behind cpu-ref. The weights are random, so what is checked is
// what can break: 200 and valid JSON (every streamed chunk too), usage agreeing with the
// tokenizer's count of the rendered template and with the tokens sent, an allowed finish_reason.
TEST_F(TinyModelTest, NorthTinyTalksWithItsOwnTokenizerAndTemplate) {
  using nlohmann::json;
  const fs::path dir = north_tiny_model_dir();
  ASSERT_TRUE(fs::exists(dir / "tokenizer.json")) << "make-model wrote no North tokenizer";
  const ChatTemplate chat_template = ChatTemplate::load(dir);
  EXPECT_EQ(chat_template.family(), ChatFamily::kCmd4);
  EXPECT_TRUE(chat_template.exact());
  TinyServer server(/*with_tokenizer=*/true, dir);
  const Tokenizer& tok = *server.stack.tokenizer;
  const ModelConfig& config = server.stack.model->config;
  EXPECT_EQ(tok.vocab_size(), config.vocab_size);
  EXPECT_EQ(tok.eos_token_id(), std::optional<int32_t>(config.eos_token_ids.at(0)));
  EXPECT_EQ(tok.token_id("<BOS_TOKEN>"), std::optional<int32_t>(config.bos_token_id));
  EXPECT_EQ(tiny_served_model(server.stack).eos_token_ids, config.eos_token_ids);
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");
  const std::vector<std::string> allowed = {"stop", "length", "tool_calls"};
  // The prompt's token count as the tokenizer counts the template's rendering of the request.
  auto rendered_tokens = [&](const std::string& text, bool with_tools) {
    ChatInput input;
    input.messages.push_back(ChatMessage{.role = "user", .content = text});
    if (with_tools) input.tools = nlohmann::ordered_json::parse(tools.dump());
    return tok.encode(chat_template.render(input), false).size();
  };

  const json chat = {{"messages", {{{"role", "user"}, {"content", "What is 12345 + 678?"}}}},
                     {"max_tokens", 12}, {"temperature", 0}};
  testing::HttpClient c(server.http->port());
  const auto r = c.request("POST", "/v1/chat/completions", chat.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.body;
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_NE(std::find(allowed.begin(), allowed.end(), choice["finish_reason"].get<std::string>()), allowed.end()) << r.body;
  EXPECT_EQ(j["usage"]["prompt_tokens"], rendered_tokens("What is 12345 + 678?", false));
  const int completion = j["usage"]["completion_tokens"];
  EXPECT_GE(completion, 1);
  EXPECT_LE(completion, 12);
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + completion);
  if (choice["finish_reason"] == "length") {
    EXPECT_EQ(completion, 12);
  }

  json streamed = chat;
  streamed["messages"][0]["content"] = "Weather in Oslo?";
  streamed["tools"] = tools;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  streamed["max_tokens"] = 16;
  const auto s = c.request("POST", "/v1/chat/completions", streamed.dump());
  ASSERT_EQ(s.status, 200) << s.body;
  const auto events = testing::sse_data(s.body);
  ASSERT_GE(events.size(), 3u) << s.body;
  EXPECT_EQ(events.back(), "[DONE]");
  std::string finish;
  json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json chunk = json::parse(events[i], nullptr, false);
    ASSERT_FALSE(chunk.is_discarded()) << events[i];
    ASSERT_FALSE(chunk.contains("error")) << events[i];
    for (const json& ch : chunk["choices"])
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    if (chunk.contains("usage") && !chunk["usage"].is_null()) usage = chunk["usage"];
  }
  EXPECT_NE(std::find(allowed.begin(), allowed.end(), finish), allowed.end()) << s.body;
  ASSERT_TRUE(usage.is_object()) << s.body;
  EXPECT_EQ(usage["prompt_tokens"], rendered_tokens("Weather in Oslo?", true));
  EXPECT_GE(usage["completion_tokens"].get<int>(), 1);
  EXPECT_LE(usage["completion_tokens"].get<int>(), 16);
}

// Structured output end to end on cpu-ref's random weights: every completed output holds its schema
// (random draws, n = 4, and streamed), a choice is one of its strings, JSON mode's output is a
// whole object or cut with "length", and a cut output ends with "length", never as complete.
TEST_F(TinyModelTest, StructuredOutputHoldsItsSchema) {
  using nlohmann::json;
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  TinyServer server;
  testing::HttpClient c(server.http->port());
  const json schema = json::parse(R"({"type": "object", "additionalProperties": false, "required": ["name", "age"],
      "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                     "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}}})");
  const json base = {{"model", "tiny"}, {"prompt", "A person as JSON:"}, {"max_tokens", 200}, {"temperature", 1.0},
                     {"seed", seed % 1000000}};

  json ask = base;
  ask["n"] = 4;
  ask["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"schema", schema}}}};
  auto r = c.request("POST", "/v1/completions", ask.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json reply = r.json();  // (a range-for over r.json()["choices"] would outlive its temporary)
  ASSERT_EQ(reply["choices"].size(), 4u);
  int checked = 0;
  for (const json& choice : reply["choices"]) {
    ++checked;
    const std::string text = choice["text"];
    EXPECT_EQ(choice["finish_reason"], "stop") << text;
    const structured::testing::Json v = structured::testing::Json::parse(text, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << text;
    const auto s = structured::testing::Json::parse(schema.dump());
    EXPECT_EQ(structured::testing::validate(v, s, s), "") << text;
  }
  EXPECT_EQ(checked, 4);

  ask = base;
  ask["structured_outputs"] = {{"choice", {"yes", "no", "maybe"}}};
  r = c.request("POST", "/v1/completions", ask.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string picked = r.json()["choices"][0]["text"];
  EXPECT_TRUE(picked == "yes" || picked == "no" || picked == "maybe") << picked;
  EXPECT_EQ(r.json()["choices"][0]["finish_reason"], "stop");

  ask = base;  // JSON mode bounds no string: cut or complete, never complete and invalid
  ask["response_format"] = {{"type", "json_object"}};
  r = c.request("POST", "/v1/completions", ask.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string any = r.json()["choices"][0]["text"];
  if (r.json()["choices"][0]["finish_reason"] == "stop") {
    EXPECT_TRUE(json::parse(any, nullptr, false).is_object()) << any;
  } else {
    EXPECT_EQ(r.json()["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(any.substr(0, 1), "{") << any;
  }

  ask = base;  // streamed: the schema's bounded output, whole
  ask["stream"] = true;
  ask["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"schema", schema}}}};
  r = c.request("POST", "/v1/completions", ask.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  std::string text, finish;
  for (const std::string& e : testing::sse_data(r.body)) {
    if (e == "[DONE]") continue;
    const json chunk = json::parse(e);
    for (const json& ch : chunk["choices"]) {
      text += ch["text"].get<std::string>();
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
    }
  }
  EXPECT_EQ(finish, "stop") << text;
  const json obj = json::parse(text, nullptr, false);
  EXPECT_TRUE(obj.is_object() && obj.contains("name") && obj.contains("age")) << text;

  ask = base;
  ask["max_tokens"] = 3;
  ask["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"schema", schema}}}};
  r = c.request("POST", "/v1/completions", ask.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["choices"][0]["finish_reason"], "length") << r.body;
  EXPECT_EQ(r.json()["usage"]["completion_tokens"], 3);
}

// A forced tool call (tool_choice named or "required") on cpu-ref's random weights: its arguments
// hold the tool's parameters schema (n = 3 random draws, and streamed), one call, finish_reason
// "tool_calls"; a schema the engine cannot enforce is a 400 naming 'tools'; a cut call ends with
// "length".
TEST_F(TinyModelTest, ForcedToolCallsHoldTheirToolsSchemas) {
  using nlohmann::json;
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  TinyServer server;
  testing::HttpClient c(server.http->port());
  const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
      "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                     "required": ["city", "days"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "route", "parameters": {"type": "object",
      "$defs": {"p": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}},
                      "required": ["x"], "additionalProperties": false}},
      "properties": {"from": {"$ref": "#/$defs/p"}, "to": {"$ref": "#/$defs/p"}},
      "required": ["from", "to"], "additionalProperties": false}}}])");
  const json base = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Plan my trip."}}}},
                     {"tools", tools}, {"max_tokens", 160}, {"temperature", 1.0}, {"seed", seed % 1000000}};
  auto check_call = [&](const json& call, const std::string& want) {
    const std::string name = call["function"]["name"];
    if (!want.empty()) {
      EXPECT_EQ(name, want);
    }
    const int t = name == "get_weather" ? 0 : 1;
    ASSERT_TRUE(name == "get_weather" || name == "route") << name;
    const std::string args = call["function"]["arguments"];
    const auto v = structured::testing::Json::parse(args, nullptr, false);
    ASSERT_FALSE(v.is_discarded()) << args;
    const auto s = structured::testing::Json::parse(tools[t]["function"]["parameters"].dump());
    EXPECT_EQ(structured::testing::validate(v, s, s), "") << args;
  };
  for (const json& choice : {json("required"), json({{"type", "function"}, {"function", {{"name", "route"}}}})}) {
    json ask = base;
    ask["n"] = 3;
    ask["tool_choice"] = choice;
    auto r = c.request("POST", "/v1/chat/completions", ask.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json reply = r.json();  // (a range-for over r.json()["choices"] would outlive its temporary)
    ASSERT_EQ(reply["choices"].size(), 3u);
    int checked = 0;
    for (const json& ch : reply["choices"]) {
      EXPECT_EQ(ch["finish_reason"], "tool_calls") << ch.dump();
      ASSERT_EQ(ch["message"]["tool_calls"].size(), 1u) << ch.dump();
      check_call(ch["message"]["tool_calls"][0], choice.is_string() ? "" : "route");
      ++checked;
    }
    EXPECT_EQ(checked, 3);
  }

  json ask = base;  // streamed: the call's deltas joined
  ask["stream"] = true;
  ask["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  auto r = c.request("POST", "/v1/chat/completions", ask.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json call = {{"function", {{"name", ""}, {"arguments", ""}}}};
  std::string finish;
  for (const std::string& e : testing::sse_data(r.body)) {
    if (e == "[DONE]") continue;
    const json chunk = json::parse(e);
    for (const json& ch : chunk["choices"]) {
      if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
      if (!ch["delta"].contains("tool_calls")) continue;
      for (const json& d : ch["delta"]["tool_calls"]) {
        EXPECT_EQ(d["index"], 0);
        if (d.contains("function") && d["function"].contains("name")) call["function"]["name"] = d["function"]["name"];
        if (d.contains("function") && d["function"].contains("arguments"))
          call["function"]["arguments"] = call["function"]["arguments"].get<std::string>() +
                                          d["function"]["arguments"].get<std::string>();
      }
    }
  }
  EXPECT_EQ(finish, "tool_calls") << r.body;
  check_call(call, "get_weather");

  ask = base;  // a keyword the engine cannot enforce, in the named tool's parameters
  ask["tools"][1]["function"]["parameters"]["patternProperties"] = {{"^x", {{"type", "integer"}}}};
  ask["tool_choice"] = {{"type", "function"}, {"function", {{"name", "route"}}}};
  r = c.request("POST", "/v1/chat/completions", ask.dump());
  ASSERT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.json()["error"]["param"], "tools") << r.body;
  EXPECT_NE(r.body.find("patternProperties"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("route"), std::string::npos) << r.body;

  ask = base;  // cut: "length", never a complete call
  ask["max_tokens"] = 4;
  ask["tool_choice"] = "required";
  r = c.request("POST", "/v1/chat/completions", ask.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["choices"][0]["finish_reason"], "length") << r.body;
}

// The same in Qwen3-Coder's XML calls (its template, --tool-call-parser qwen3_coder): enum text
// parameters, the others JSON read back by their declared type; every call's arguments hold the
// tool's schema (n = 3 random draws, required and named); a text parameter's length is a 400
// naming 'tools', the keyword and the tool. (Free text parameters are left to the walks of
// test_forced_tool_call and the scripted server: random weights almost never write the
// "\n</parameter>" that ends one.)
TEST_F(TinyModelTest, ForcedQwen3CoderCallsHoldTheirToolsSchemas) {
  using nlohmann::json;
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  ChatFlags flags;
  flags.chat_template = fs::path(MEGADECODE_SOURCE_DIR) / "tests/data/qwen3_coder_chat_template.jinja";
  flags.tool_call_parser = "qwen3_coder";
  TinyServer server(true, tiny_model_dir(), flags);
  testing::HttpClient c(server.http->port());
  const json tools = json::parse(R"([
    {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
      "path": {"type": "string", "enum": ["/tmp/a", "/tmp/b c"]}, "mode": {"type": ["integer", "null"],
      "minimum": 0, "maximum": 511}, "lines": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
      "maxItems": 3}, "force": {"type": "boolean"},
      "kind": {"type": "string", "enum": ["text", "binary"]}},
      "required": ["path", "kind"], "additionalProperties": false}}},
    {"type": "function", "function": {"name": "route", "parameters": {"type": "object",
      "$defs": {"p": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99}},
                      "required": ["x"], "additionalProperties": false}},
      "properties": {"from": {"type": "object", "properties": {"at": {"$ref": "#/$defs/p"}}, "required": ["at"],
                              "additionalProperties": false}},
      "required": ["from"], "additionalProperties": false}}}])");
  const json base = {{"model", "tiny"}, {"messages", {{{"role", "user"}, {"content", "Save it."}}}},
                     {"tools", tools}, {"max_tokens", 200}, {"temperature", 1.0}, {"seed", seed % 1000000}, {"n", 3}};
  int calls = 0;
  for (const json& choice : {json("required"), json({{"type", "function"}, {"function", {{"name", "route"}}}})}) {
    json ask = base;
    ask["tool_choice"] = choice;
    auto r = c.request("POST", "/v1/chat/completions", ask.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json reply = r.json();  // (a range-for over r.json()["choices"] would outlive its temporary)
    ASSERT_EQ(reply["choices"].size(), 3u);
    for (const json& ch : reply["choices"]) {
      EXPECT_EQ(ch["finish_reason"], "tool_calls") << ch.dump();
      ASSERT_EQ(ch["message"]["tool_calls"].size(), 1u) << ch.dump();
      const json& call = ch["message"]["tool_calls"][0];
      const std::string name = call["function"]["name"];
      ASSERT_TRUE(name == "write_file" || name == "route") << name;
      if (choice.is_object()) {
        EXPECT_EQ(name, "route");
      }
      const auto v = structured::testing::Json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
      ASSERT_TRUE(v.is_object()) << call.dump();
      const auto s = structured::testing::Json::parse(tools[name == "write_file" ? 0 : 1]["function"]["parameters"].dump());
      EXPECT_EQ(structured::testing::validate(v, s, s), "") << call.dump();
      ++calls;
    }
  }
  EXPECT_EQ(calls, 6);

  json ask = base;  // a length on a text parameter: raw text cannot count it
  ask["tools"][0]["function"]["parameters"]["properties"]["path"] = {{"type", "string"}, {"maxLength", 8}};
  ask["tool_choice"] = "required";
  auto r = c.request("POST", "/v1/chat/completions", ask.dump());
  ASSERT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.json()["error"]["param"], "tools") << r.body;
  for (const char* word : {"maxLength", "/properties/path", "write_file", "Qwen3-Coder"})
    EXPECT_NE(r.body.find(word), std::string::npos) << word << ": " << r.body;
}

// A thousand random schemas of the supported subset (structured_test_util.h's generator) through
// the engine on cpu-ref's random weights and Qwen3's tokenizer, 32 sequences a step: every output
// that ends with the end token parses and validates against its schema; one cut by max_tokens
// ends with "length". (The random walks of test_structured_random check the grammar alone.)
TEST_F(TinyModelTest, ThousandSchemasHoldOnCpuRef) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  TinyStack stack(/*kv_blocks=*/512, /*block_size=*/16, /*max_num_seqs=*/32, /*chunk=*/64);
  structured::Compiler compiler(structured::Vocabulary::from_tokenizer(*stack.tokenizer, {151645, 151643}));
  structured::testing::SchemaGenerator gen(seed);
  SplitMix64 rng(seed ^ 0x7e57);
  stack.engine->start();
  constexpr int kSchemas = 1000, kWave = 100;
  int n_stop = 0, n_length = 0, n_overflow = 0, n_failed = 0;
  for (int w0 = 0; w0 < kSchemas && n_failed < 5; w0 += kWave) {
    auto sink = std::make_shared<testing::CollectingSink>();
    std::vector<structured::testing::Json> schemas;
    for (int i = w0; i < w0 + kWave; ++i) {
      schemas.push_back(gen.schema());
      SequenceRequest s;
      s.request_id = static_cast<uint64_t>(i) + 1;
      s.prompt = stack.tokenizer->encode("JSON:", false);
      for (int k = 0, n = static_cast<int>(rng.below(6)); k < n; ++k) s.prompt.push_back(static_cast<int32_t>(rng.below(150000)));
      s.sampling.temperature = 1.0f;
      s.sampling.seed = seed + static_cast<uint64_t>(i);
      s.stop.max_tokens = 48;
      s.stop.eos_token_ids = {151645, 151643};
      s.constraint = compiler.make(structured::Spec::json_schema(schemas.back().dump()));
      s.sink = sink;
      ASSERT_EQ(stack.engine->submit({s}), SubmitStatus::kOk);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(300);
    for (;;) {
      size_t finished = 0;
      {
        std::lock_guard<std::mutex> lock(sink->mutex);
        for (const SeqOutput& e : sink->events) finished += e.finished;
      }
      if (finished == static_cast<size_t>(kWave)) break;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "generation did not finish";
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::map<uint64_t, std::string> text;
    std::map<uint64_t, FinishReason> finish;
    for (const SeqOutput& e : sink->events) {
      text[e.request_id] += e.text;
      if (e.finished) finish[e.request_id] = e.finish_reason;
    }
    for (int i = w0; i < w0 + kWave; ++i) {
      const uint64_t id = static_cast<uint64_t>(i) + 1;
      const structured::testing::Json& schema = schemas[static_cast<size_t>(i - w0)];
      ASSERT_NE(finish[id], FinishReason::kError) << text[id];
      if (finish[id] == FinishReason::kLength) {
        ++n_length;
        continue;
      }
      ++n_stop;
      structured::testing::Json v;
      try {
        v = structured::testing::Json::parse(text[id]);
      } catch (const nlohmann::json::out_of_range&) {
        ++n_overflow;  // a number beyond a double: valid JSON the parser refuses
        continue;
      } catch (const nlohmann::json::exception& e) {
        ADD_FAILURE() << "schema " << i << ": " << text[id] << " does not parse: " << e.what() << "\n" << schema.dump();
        ++n_failed;
        continue;
      }
      const std::string why = structured::testing::validate(v, schema, schema);
      if (!why.empty()) {
        ADD_FAILURE() << "schema " << i << ": " << text[id] << " fails: " << why << "\n" << schema.dump();
        ++n_failed;
      }
    }
  }
  stack.engine->stop();
  std::printf("%d ended by the end token, %d cut by max_tokens (%d with numbers beyond a double)\n", n_stop, n_length,
              n_overflow);
  EXPECT_GE(n_stop, kSchemas * 4 / 10);
}

TEST_F(TinyModelTest, WithoutTokenizerTheSameTokensComeBackAsIds) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  SplitMix64 rng(seed);
  TinyServer with_text;
  TinyServer ids_only(/*with_tokenizer=*/false);
  // Qwen3's end tokens, from config.json and generation_config.json: the tokenizer adds none.
  EXPECT_EQ(tiny_served_model(ids_only.stack).eos_token_ids, (std::vector<int32_t>{151645, 151643}));
  EXPECT_EQ(tiny_served_model(with_text.stack).eos_token_ids, (std::vector<int32_t>{151645, 151643}));
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> prompt;
    for (int k = 0, n = 3 + static_cast<int>(rng.below(20)); k < n; ++k)
      prompt.push_back(static_cast<int32_t>(rng.below(151000)));
    const nlohmann::json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0},
                                 {"ignore_eos", true}};
    testing::HttpClient c(ids_only.http->port());
    auto r = c.request("POST", "/v1/completions", body.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const nlohmann::json choice = r.json()["choices"][0];
    const auto ids = choice["token_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(ids, reference_generate(*ids_only.stack.model, prompt, 12)) << "prompt " << i;
    EXPECT_EQ(choice["text"], "");
    // The tokenizer server's text is those ids detokenized.
    std::unique_ptr<TextDecoder> decoder = streaming_decoders(*with_text.stack.tokenizer)(true);
    std::string expected;
    for (int32_t t : ids) expected += decoder->push(t);
    expected += decoder->flush();
    testing::HttpClient t(with_text.http->port());
    auto text = t.request("POST", "/v1/completions", body.dump());
    ASSERT_EQ(text.status, 200) << text.body;
    EXPECT_EQ(text.json()["choices"][0]["text"], expected) << "prompt " << i;
    EXPECT_FALSE(text.json()["choices"][0].contains("token_ids"));
  }
}

// The model's vocabulary (151936) is padded past the tokenizer's (151669 ids): a prompt id that no
// token has is refused with the bound, as vLLM does; without a tokenizer the model's bound holds.
TEST_F(TinyModelTest, PromptIdsBeyondTheTokenizerAreRefused) {
  TinyServer with_text;
  TinyServer ids_only(/*with_tokenizer=*/false);
  const int model_vocab = with_text.stack.model->config.vocab_size;
  const int tokenizer_vocab = with_text.stack.tokenizer->vocab_size();
  ASSERT_LT(tokenizer_vocab, model_vocab);
  auto post = [](TinyServer& s, std::vector<int64_t> prompt, const char* path = "/v1/completions") {
    testing::HttpClient c(s.http->port());
    const nlohmann::json body = std::string(path) == "/detokenize"
                                    ? nlohmann::json{{"tokens", prompt}}
                                    : nlohmann::json{{"prompt", prompt}, {"max_tokens", 1}};
    return c.request("POST", path, body.dump());
  };
  for (int64_t id : {int64_t{tokenizer_vocab}, int64_t{model_vocab} - 1}) {
    auto r = post(with_text, {1, id});
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_NE(r.body.find("Token id " + std::to_string(id) + " is out of vocabulary: prompt token ids must be below " +
                          std::to_string(tokenizer_vocab)),
              std::string::npos)
        << r.body;
    auto d = post(with_text, {1, id}, "/detokenize");
    EXPECT_EQ(d.status, 400) << d.body;
    EXPECT_NE(d.body.find("[0, " + std::to_string(tokenizer_vocab) + ")"), std::string::npos) << d.body;
  }
  EXPECT_EQ(post(with_text, {1, tokenizer_vocab - 1}).status, 200);
  EXPECT_EQ(post(ids_only, {1, model_vocab - 1}).status, 200);
  auto r = post(ids_only, {1, model_vocab});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("must be below " + std::to_string(model_vocab)), std::string::npos) << r.body;
}

TEST_F(TinyModelTest, OpenAiNodeClientPasses) {
  ASSERT_TRUE(fs::exists(kRoot / "node_modules/openai/package.json")) << "run scripts/setup";
  TinyServer server;
  const std::string cmd = "cd '" + kRoot.string() + "' && timeout 240 node tests/server/openai_client_test.mjs " +
                          "http://127.0.0.1:" + std::to_string(server.http->port()) + "/v1 tiny 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

}  // namespace
}  // namespace megadecode
