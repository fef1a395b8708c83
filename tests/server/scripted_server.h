// A test server that answers like a Qwen3, Qwen3-Coder or North (cmd4) model: the scripted backend
// behind the real Qwen3 tokenizer and the real chat template (Qwen3's from data/tokenizer/qwen3,
// Qwen3-Coder's and cmd4's from tests/data), with the template family's reasoning and tool-call
// parsing. The Qwen3 tokenizer has no cmd4 markers: they reach the server as several tokens each;
// given a model folder (a synthetic North one), its tokenizer and template are used instead.
// Replies are scripted by marker: the rule whose marker occurs last in the prompt text wins. It
// records every chat request body and every byte sent back, for end-to-end client tests.
#pragma once

#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "scripted_backend.h"
#include "server/http_server.h"
#include "server/model_text.h"
#include "server/openai_service.h"
#include "server_fixture.h"

namespace megadecode::testing {

// One exchange's traffic: the request body and what went back.
struct ExchangeRecord {
  std::string path;
  std::string request;
  std::string response;  // the response body, or the concatenated stream
};

// Forwards to the connection's exchange and copies everything sent into a record.
class RecordingExchange : public Exchange {
 public:
  RecordingExchange(std::shared_ptr<Exchange> inner, std::shared_ptr<ExchangeRecord> record, std::mutex& mutex)
      : inner_(std::move(inner)), record_(std::move(record)), mutex_(mutex) {}
  void post(std::function<void()> fn) override { inner_->post(std::move(fn)); }
  void respond(int status, const std::string& content_type, std::string body, const HttpHeaders& headers) override {
    append(body);
    inner_->respond(status, content_type, std::move(body), headers);
  }
  void begin_stream(const std::string& content_type) override { inner_->begin_stream(content_type); }
  void stream(std::string data) override {
    append(data);
    inner_->stream(std::move(data));
  }
  void end_stream() override { inner_->end_stream(); }
  bool client_gone() const override { return inner_->client_gone(); }
  void on_client_gone(std::function<void()> fn) override { inner_->on_client_gone(std::move(fn)); }

 private:
  void append(const std::string& s) {
    std::lock_guard<std::mutex> lock(mutex_);
    record_->response += s;
  }
  std::shared_ptr<Exchange> inner_;
  std::shared_ptr<ExchangeRecord> record_;
  std::mutex& mutex_;
};

inline std::filesystem::path qwen3_tokenizer_dir() {
  return std::filesystem::path(MEGADECODE_SOURCE_DIR) / "data/tokenizer/qwen3";
}
inline std::filesystem::path qwen3_coder_template() {
  return std::filesystem::path(MEGADECODE_SOURCE_DIR) / "tests/data/qwen3_coder_chat_template.jinja";
}
inline std::filesystem::path cmd4_template() {
  return std::filesystem::path(MEGADECODE_SOURCE_DIR) / "tests/data/cmd4/cmd4-hf.jinja";
}

class ScriptedServer {
 public:
  static constexpr int kMaxPositions = 1 << 17;  // room for an agent's long prompt plus max_tokens 32000
  static constexpr int kBlockSize = 16;

  // With model_dir, the folder's own tokenizer, end token and chat template (a North one: cmd4
  // with its markers as single tokens) instead of Qwen3's and the family's template.
  explicit ScriptedServer(ChatFamily family, ChatFlags flags = {}, const std::filesystem::path& model_dir = {})
      : dir_(model_dir.empty() ? qwen3_tokenizer_dir() : model_dir),
        tokenizer_(Tokenizer::load(dir_)),
        end_token_(model_dir.empty() ? *tokenizer_->token_id("<|im_end|>") : tokenizer_->eos_token_id().value()),
        backend_(tokenizer_->vocab_size(), end_token_, [this](std::span<const int32_t> p) { return choose(p); },
                 kMaxPositions / kBlockSize, kBlockSize, kMaxPositions) {
    EngineConfig ec;
    ec.scheduler = SchedulerConfig{.max_num_seqs = 8, .max_prefill_tokens = 2048, .prefix_caching = true,
                                   .check_invariants = false};
    engine_ = std::make_unique<Engine>(backend_, ec, streaming_decoders(*tokenizer_));
    if (model_dir.empty() && family == ChatFamily::kQwen3Coder && !flags.chat_template)
      flags.chat_template = qwen3_coder_template();
    if (model_dir.empty() && family == ChatFamily::kCmd4 && !flags.chat_template) flags.chat_template = cmd4_template();
    ModelConfig config = backend_.config();
    model_name_ = family == ChatFamily::kQwen3        ? "qwen3-scripted"
                  : family == ChatFamily::kQwen3Coder ? "qwen3-coder-scripted"
                                                      : "north-cmd4-scripted";
    service_ = std::make_unique<OpenAiService>(
        *engine_, served_model(dir_, model_name_, config, *tokenizer_, flags));
    HttpServerConfig hc;
    hc.port = 0;
    hc.n_threads = 2;
    hc.max_body_bytes = 16 << 20;
    http_ = std::make_unique<HttpServer>(hc, [this](HttpRequest&& r, std::shared_ptr<Exchange> e) {
      auto record = std::make_shared<ExchangeRecord>(ExchangeRecord{r.path, r.body, ""});
      {
        std::lock_guard<std::mutex> lock(mutex_);
        records_.push_back(record);
      }
      service_->handle(std::move(r), std::make_shared<RecordingExchange>(std::move(e), record, mutex_));
    });
    engine_->start();
    http_->start();
  }
  ~ScriptedServer() {
    http_->stop();
    engine_->stop();
  }

  int port() const { return http_->port(); }
  const std::string& model() const { return model_name_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  int32_t end_token() const { return end_token_; }

  // When `marker` is the last marker in a prompt, the reply is `tokens`.
  void on(const std::string& marker, std::vector<int32_t> tokens) {
    std::lock_guard<std::mutex> lock(mutex_);
    rules_.emplace_back(marker, std::move(tokens));
  }
  // The reply as the tokenizer encodes it (tags such as <tool_call> become their single token).
  void on_text(const std::string& marker, const std::string& reply) { on(marker, encode(reply)); }
  std::vector<int32_t> encode(const std::string& text) const { return tokenizer_->encode(text, false); }
  // Pieces encoded one by one: a tag cut across pieces reaches the server as several tokens.
  std::vector<int32_t> encode_pieces(const std::vector<std::string>& pieces) const {
    std::vector<int32_t> out;
    for (const std::string& p : pieces)
      for (int32_t t : encode(p)) out.push_back(t);
    return out;
  }

  // Every prompt the backend started from, as token ids and as text.
  std::vector<std::vector<int32_t>> prompt_ids() const { return backend_.prompts(); }
  std::vector<std::string> prompts() const {
    std::vector<std::string> out;
    for (const auto& p : backend_.prompts()) out.push_back(tokenizer_->decode(p, false));
    return out;
  }
  std::vector<ExchangeRecord> records(const std::string& path = "/v1/chat/completions") const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<ExchangeRecord> out;
    for (const auto& r : records_)
      if (r->path == path) out.push_back(*r);
    return out;
  }

 private:
  std::vector<int32_t> choose(std::span<const int32_t> prompt) {
    const std::string text = tokenizer_->decode(prompt, false);
    std::lock_guard<std::mutex> lock(mutex_);
    const std::vector<int32_t>* best = nullptr;
    size_t best_at = 0;
    for (const auto& [marker, reply] : rules_) {
      const size_t at = text.rfind(marker);
      if (at != std::string::npos && (best == nullptr || at >= best_at)) {
        best = &reply;
        best_at = at;
      }
    }
    return best != nullptr ? *best : encode("(no script for this prompt)");
  }

  std::filesystem::path dir_;
  std::unique_ptr<Tokenizer> tokenizer_;
  int32_t end_token_;
  ScriptedBackend backend_;
  std::string model_name_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<OpenAiService> service_;
  std::unique_ptr<HttpServer> http_;
  mutable std::mutex mutex_;
  std::vector<std::pair<std::string, std::vector<int32_t>>> rules_;
  std::vector<std::shared_ptr<ExchangeRecord>> records_;
};

}  // namespace megadecode::testing
