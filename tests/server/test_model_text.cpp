// The ServedModel builders of server/model_text: the end tokens each gathers and in which order
// (config.json, generation_config.json, then the tokenizer's), the defaults, and the model without
// a tokenizer (--skip-tokenizer-init), whose decoders release no text and which, given no model
// directory (--random-weights), reads no generation_config.json from anywhere. Also North's cmd4
// template named by --chat-template: rendered, its kwargs read, its refusals a 400.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "server/api_error.h"
#include "server/chat_request.h"
#include "server/model_text.h"
#include "server_fixture.h"

namespace megadecode {
namespace {

namespace fs = std::filesystem;

// A model directory holding only generation_config.json; removed at the end of the test.
class ModelDir {
 public:
  explicit ModelDir(const std::string& generation_config)
      : path_(fs::temp_directory_path() /
              ("model_text_" + std::to_string(::getpid()) + "_" + std::to_string(next_++))) {
    fs::create_directories(path_);
    std::ofstream(path_ / "generation_config.json") << generation_config;
  }
  ~ModelDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  static inline int next_ = 0;
  fs::path path_;
};

ModelConfig config_with_end_tokens(std::vector<int> eos) {
  ModelConfig c;
  c.vocab_size = testing::kFakeVocab;
  c.eos_token_ids = std::move(eos);
  return c;
}

const char* kGenerationConfig = R"({"eos_token_id": [7, 3], "temperature": 0.5, "max_new_tokens": 5})";

TEST(ModelText, WithoutTokenizerEndTokensComeFromTheConfigs) {
  ModelDir dir(kGenerationConfig);
  const ServedModel m = served_model_without_tokenizer(dir.path(), "m", config_with_end_tokens({3, 9}));
  EXPECT_EQ(m.tokenizer, nullptr);
  EXPECT_EQ(m.eos_token_ids, (std::vector<int32_t>{3, 9, 7}));  // config.json first, no repeats
  EXPECT_EQ(m.name, "m");
  EXPECT_EQ(m.root, dir.path().string());
  EXPECT_EQ(m.defaults.sampling.temperature, 0.5f);
  EXPECT_EQ(m.defaults.max_new_tokens, 5);
  EXPECT_FALSE(m.chat.render);
}

TEST(ModelText, WithoutModelDirectoryNothingIsRead) {
  // A generation_config.json in the working directory must not be taken for the model's.
  ModelDir cwd(kGenerationConfig);
  const fs::path before = fs::current_path();
  fs::current_path(cwd.path());
  const ServedModel m = served_model_without_tokenizer({}, "qwen3-30b-a3b", config_with_end_tokens({151645}));
  fs::current_path(before);
  EXPECT_EQ(m.eos_token_ids, (std::vector<int32_t>{151645}));
  EXPECT_EQ(m.root, "qwen3-30b-a3b");
  EXPECT_FALSE(m.defaults.sampling.temperature.has_value());
  EXPECT_FALSE(m.defaults.max_new_tokens.has_value());
}

TEST(ModelText, WithTokenizerItsEndTokenComesLast) {
  ModelDir dir(kGenerationConfig);
  testing::FakeTokenizer tokenizer;  // end token kFakeEos
  const ServedModel m = served_model(dir.path(), "m", config_with_end_tokens({9}), tokenizer, ChatFlags{});
  EXPECT_EQ(m.tokenizer, &tokenizer);
  EXPECT_EQ(m.eos_token_ids, (std::vector<int32_t>{9, 7, 3, testing::kFakeEos}));
  EXPECT_EQ(m.root, dir.path().string());
  EXPECT_EQ(m.defaults.max_new_tokens, 5);
  EXPECT_FALSE(m.chat.render);  // the directory has no chat template
  EXPECT_NE(m.chat.unavailable.find("serves no chat"), std::string::npos) << m.chat.unavailable;
}

TEST(ModelText, NoTextDecodersReleaseNothing) {
  for (bool skip_special : {false, true}) {
    std::unique_ptr<TextDecoder> d = no_text_decoders()(skip_special);
    ASSERT_NE(d, nullptr);
    for (int32_t t : {0, 65, testing::kFakeEos, 151645, 1 << 30}) EXPECT_EQ(d->push(t), "");
    EXPECT_EQ(d->flush(), "");
  }
}

TEST(ModelText, ChatTemplateFlagServesCmd4) {
  ChatFlags flags;
  flags.chat_template = fs::path(MEGADECODE_SOURCE_DIR) / "tests/data/cmd4/cmd4-hf.jinja";
  const ChatSupport support = chat_support(fs::temp_directory_path(), flags);
  ASSERT_TRUE(support.render);
  EXPECT_EQ(support.tool_format, ToolCallFormat::kCohereCommand4);  // the family's parsers by default
  EXPECT_EQ(support.reasoning_format, ReasoningFormat::kCohereCommand4);
  ChatRequest chat = parse_chat_request(RequestJson::parse(
      R"({"messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}],
          "chat_template_kwargs": {"reasoning_effort": "none"}})"));
  const std::string prompt = render_chat(chat.input, support);
  EXPECT_EQ(prompt.rfind("<BOS_TOKEN><|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", 0), 0u) << prompt;
  const std::string tail = "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|><|START_TEXT|>Be brief.<|END_TEXT|><|END_OF_TURN_TOKEN|>"
                           "<|START_OF_TURN_TOKEN|><|USER_TOKEN|><|START_TEXT|>hi<|END_TEXT|><|END_OF_TURN_TOKEN|>"
                           "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>";
  EXPECT_EQ(prompt.substr(prompt.size() - tail.size()), tail);
  EXPECT_THROW(parse_chat_request(RequestJson::parse(
                   R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"reasoning": "yes"}})")),
               ApiError);
  // A tool result that answers no call: 400, naming the message.
  chat = parse_chat_request(RequestJson::parse(
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "x", "content": "r"}]})"));
  try {
    render_chat(chat.input, support);
    ADD_FAILURE() << "rendered";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("message 1 (tool)"), std::string::npos) << e.what();
  }
}

// What prepare_chat makes of cmd4: reasoning on or off from its kwargs, the markers kept in the
// text (they are special tokens), a forced call after a closed reasoning block, and the flags.
TEST(ModelText, Cmd4ParsersFollowTheRequest) {
  ChatFlags flags;
  flags.chat_template = fs::path(MEGADECODE_SOURCE_DIR) / "tests/data/cmd4/cmd4-hf.jinja";
  const ChatSupport support = chat_support(fs::temp_directory_path(), flags);
  const std::string tools = R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])";
  auto prepare = [&](const std::string& extra, ChatOutputOptions* out) {
    const ChatRequest chat = parse_chat_request(
        RequestJson::parse(R"({"messages": [{"role": "user", "content": "hi"}], "tools": )" + tools + extra + "}"));
    return prepare_chat(chat, support, out);
  };
  ChatOutputOptions out;
  std::string prompt = prepare("", &out);
  EXPECT_TRUE(prompt.ends_with("<|CHATBOT_TOKEN|><|START_THINKING|>")) << prompt;
  EXPECT_TRUE(out.reasoning);
  EXPECT_EQ(out.reasoning_format, ReasoningFormat::kCohereCommand4);
  EXPECT_EQ(out.tool_format, ToolCallFormat::kCohereCommand4);
  EXPECT_TRUE(out.is_cmd4() && out.active());
  prompt = prepare(R"(, "chat_template_kwargs": {"reasoning": false})", &out);
  EXPECT_TRUE(prompt.ends_with("<|START_THINKING|><|END_THINKING|>")) << prompt;
  EXPECT_FALSE(out.reasoning);
  prompt = prepare(R"(, "tool_choice": {"type": "function", "function": {"name": "f"}})", &out);
  EXPECT_TRUE(prompt.ends_with("<|START_THINKING|><|END_THINKING|><|START_ACTION|>[\n    {\"tool_call_id\": \"0\", "
                               "\"tool_name\": \"f\", \"parameters\": "))
      << prompt;
  EXPECT_FALSE(out.reasoning);
  prompt = prepare(R"(, "tool_choice": "required", "chat_template_kwargs": {"reasoning_effort": "none"})", &out);
  EXPECT_TRUE(prompt.ends_with("<|START_THINKING|><|END_THINKING|><|START_ACTION|>[\n    {\"tool_call_id\": \"0\", "
                               "\"tool_name\": \""))
      << prompt;
  // A continued answer goes on in the answer, not in reasoning.
  const ChatRequest continued = parse_chat_request(RequestJson::parse(
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}],
          "add_generation_prompt": false, "continue_final_message": true})"));
  EXPECT_TRUE(prepare_chat(continued, support, &out).ends_with("<|START_TEXT|>Hel"));
  EXPECT_FALSE(out.reasoning);
  EXPECT_TRUE(out.is_cmd4());
  prepare(R"(, "tool_choice": "none")", &out);
  EXPECT_FALSE(out.tool_format);
  EXPECT_TRUE(out.is_cmd4());  // the reasoning split still runs

  ChatFlags off = flags;
  off.reasoning_parser = "none";
  off.tool_call_parser = "none";
  const ChatSupport plain = chat_support(fs::temp_directory_path(), off);
  EXPECT_FALSE(plain.reasoning_format);
  EXPECT_FALSE(plain.tool_format);
  ChatFlags qwen_names_cmd4;
  qwen_names_cmd4.reasoning_parser = "cohere_command4";
  qwen_names_cmd4.tool_call_parser = "cohere_command4";
  // The template's reasoning block is closed before a forced call whichever parsers run.
  ChatFlags calls_only = flags;
  calls_only.reasoning_parser = "none";
  const ChatSupport calls = chat_support(fs::temp_directory_path(), calls_only);
  const ChatRequest forced = parse_chat_request(RequestJson::parse(
      R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "required", "tools": )" + tools + "}"));
  EXPECT_TRUE(prepare_chat(forced, calls, &out)
                  .ends_with("<|START_THINKING|><|END_THINKING|><|START_ACTION|>[\n    {\"tool_call_id\": \"0\", "
                             "\"tool_name\": \""));
  EXPECT_FALSE(out.reasoning);
  EXPECT_TRUE(out.is_cmd4());
  const ChatSupport named = chat_support(fs::temp_directory_path(), qwen_names_cmd4);
  EXPECT_EQ(named.reasoning_format, ReasoningFormat::kCohereCommand4);
  EXPECT_EQ(named.tool_format, ToolCallFormat::kCohereCommand4);
  ChatFlags bad;
  bad.reasoning_parser = "cohere_command3";
  EXPECT_THROW(chat_support(fs::temp_directory_path(), bad), Error);
}

}  // namespace
}  // namespace megadecode
