// Conformance of the chat templates with the models' own Jinja templates run by @huggingface/jinja
// (scripts/chat_template_reference.mjs): byte-identical prompts for thousands of generated
// conversations per template (Qwen3, Qwen3-Coder, cmd4), covering tools, tool calls, tool
// results, reasoning, the thinking and reasoning flags and the template options (for cmd4 also
// documents, grounding, the platform instruction, JSON mode, kept ids, contents and tool results
// as parts); errors must agree too (both refuse, or neither).
#include <gtest/gtest.h>

#include "chat_samples.h"
#include "tokenizer_test_util.h"

namespace megadecode {
namespace {

using testing::escaped;
using OJson = nlohmann::ordered_json;

constexpr int kConversations = 2000;  // per template
constexpr int kMaxReported = 8;

struct Coverage {
  int with_tools = 0, with_tool_calls = 0, with_tool_results = 0, with_reasoning = 0, continued = 0, errors = 0;
  int thinking[3] = {0, 0, 0};  // unset, true, false
  int reasoning[3] = {0, 0, 0};  // cmd4's: unset, true, false (after reasoning_effort)
  // cmd4's other variables: documents, grounding enabled, a platform instruction override,
  // JSON mode, kept ids, turns given as parts, tool results given as parts or objects.
  int documents = 0, grounding = 0, platform = 0, json_mode = 0, kept_ids = 0, turn_parts = 0, result_parts = 0;
};

// Every cmd4 tool has parameters now and then left out: the template cannot render a tool
// without them (json.dumps of Undefined), so a conversation with one is refused by both.
void give_parameters(ChatInput& in, int index) {
  for (auto& tool : in.tools) {
    auto& f = tool["function"];
    if (!f.contains("parameters") && index % 8 != 0) f["parameters"] = OJson{{"type", "object"}, {"properties", OJson::object()}};
  }
}

OJson reference_input(const ChatInput& in, const char* family) {
  OJson messages = OJson::array();
  for (const ChatMessage& m : in.messages) messages.push_back(testing::message_json(m));
  OJson j = {{"template", family}, {"messages", messages}, {"add_generation_prompt", in.add_generation_prompt}};
  if (!in.tools.empty() || in.messages.size() % 2 == 0) j["tools"] = in.tools;  // an empty list, now and then
  if (in.continue_final_message) j["continue_final_message"] = true;
  if (in.enable_thinking) j["enable_thinking"] = *in.enable_thinking;
  if (in.reasoning) j["reasoning"] = *in.reasoning;
  if (in.reasoning_effort) j["reasoning_effort"] = *in.reasoning_effort;
  // cmd4's: megadecode gives the template the request's tools as a list, empty when there are
  // none (as melody does; the template iterates tools when there are documents).
  if (!in.documents.empty()) {
    j["documents"] = in.documents;
    j["tools"] = in.tools;
  }
  if (in.grounding) j["grounding"] = *in.grounding;
  if (in.platform_instruction_override) j["platform_instruction_override"] = *in.platform_instruction_override;
  if (in.regen_tool_call_ids) j["regen_tool_call_ids"] = *in.regen_tool_call_ids;
  if (!in.response_format.is_null()) j["response_format"] = in.response_format;
  return j;
}

void check_family(ChatFamily family, const std::filesystem::path& template_file, bool from_config) {
  const uint64_t seed = test_seed();
  std::printf("seed %llu (MEGADECODE_SEED reproduces it)\n", static_cast<unsigned long long>(seed));
  const ChatTemplate tmpl = from_config ? ChatTemplate::load(template_file) : [&] {
    std::ifstream in(template_file);
    std::stringstream text;
    text << in.rdbuf();
    return ChatTemplate::from_text(text.str());
  }();
  ASSERT_EQ(tmpl.family(), family);
  EXPECT_TRUE(tmpl.exact()) << "the template text differs from the published one this renderer reproduces";

  testing::ChatSampler sampler(seed);
  testing::Cmd4Features cmd4_features(seed + 1);
  std::vector<ChatInput> inputs;
  OJson ref_inputs = OJson::array();
  Coverage cov;
  for (int i = 0; i < kConversations; ++i) {
    inputs.push_back(sampler.conversation());
    if (family == ChatFamily::kCmd4) {
      give_parameters(inputs.back(), i);
      cmd4_features.add(inputs.back());
    }
    const ChatInput& in = inputs.back();
    cov.documents += !in.documents.empty();
    cov.grounding += in.grounding && (*in.grounding == "enabled" || *in.grounding == "ENABLED" || *in.grounding == "Enabled");
    cov.platform += in.platform_instruction_override.has_value();
    cov.json_mode += !in.response_format.is_null() && in.response_format["type"] != "text";
    cov.kept_ids += in.regen_tool_call_ids == false;
    bool turn_parts = false, result_parts = false;
    for (const ChatMessage& m : in.messages) (m.role == "tool" ? result_parts : turn_parts) |= !m.parts.is_null();
    cov.turn_parts += turn_parts;
    cov.result_parts += result_parts;
    ref_inputs.push_back(reference_input(in, chat_family_name(family)));
    cov.with_tools += !in.tools.empty();
    bool calls = false, results = false, reasoning = false;
    for (const ChatMessage& m : in.messages) {
      calls |= !m.tool_calls.empty();
      results |= m.role == "tool";
      reasoning |= m.reasoning_content.has_value() || m.content.find("</think>") != std::string::npos;
    }
    cov.with_tool_calls += calls;
    cov.with_tool_results += results;
    cov.with_reasoning += reasoning;
    cov.continued += in.continue_final_message;
    ++cov.thinking[!in.enable_thinking ? 0 : (*in.enable_thinking ? 1 : 2)];
    ++cov.reasoning[!in.reasoning && !in.reasoning_effort ? 0 : (cmd4_reasoning(in) ? 1 : 2)];
  }
  const nlohmann::json results = testing::run_node_reference("chat_template_reference.mjs", "", ref_inputs.dump())["results"];
  ASSERT_EQ(results.size(), inputs.size());
  int mismatches = 0;
  size_t bytes = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string ours, error;
    try {
      ours = tmpl.render(inputs[i]);
    } catch (const Error& e) {
      error = e.what();
    }
    const bool ref_error = results[i].is_object();
    cov.errors += ref_error;
    bytes += ours.size();
    const std::string theirs = ref_error ? "" : results[i].get<std::string>();
    const bool same = ref_error ? !error.empty() : (error.empty() && ours == theirs);
    if (!same && ++mismatches <= kMaxReported) {
      size_t at = 0;
      while (at < ours.size() && at < theirs.size() && ours[at] == theirs[at]) ++at;
      ADD_FAILURE() << chat_family_name(family) << " conversation " << i << ": " << ref_inputs[i].dump().substr(0, 600)
                    << "\n  ours:      " << (error.empty() ? "\"" + escaped(ours.substr(at > 60 ? at - 60 : 0), 300) + "\"" : "error: " + error)
                    << "\n  reference: " << (ref_error ? "error: " + results[i]["error"].dump() : "\"" + escaped(theirs.substr(at > 60 ? at - 60 : 0), 300) + "\"")
                    << "\n  (first difference at byte " << at << ")";
    }
  }
  std::printf("%s: %zu conversations, %zu prompt bytes; %d with tools, %d with tool calls, %d with tool results, "
              "%d with reasoning, %d continue_final_message; enable_thinking unset/true/false %d/%d/%d; reasoning "
              "kwargs unset/on/off %d/%d/%d; %d refused by both; %d mismatches\n",
              chat_family_name(family), inputs.size(), bytes, cov.with_tools, cov.with_tool_calls, cov.with_tool_results,
              cov.with_reasoning, cov.continued, cov.thinking[0], cov.thinking[1], cov.thinking[2], cov.reasoning[0],
              cov.reasoning[1], cov.reasoning[2], cov.errors, mismatches);
  if (family == ChatFamily::kCmd4) {
    std::printf("cmd4: %d with documents, %d grounding enabled, %d platform instruction override, %d JSON mode, %d "
                "kept ids, %d with turns as parts, %d with tool results as parts or objects\n",
                cov.documents, cov.grounding, cov.platform, cov.json_mode, cov.kept_ids, cov.turn_parts, cov.result_parts);
    for (int n : {cov.documents, cov.grounding, cov.platform, cov.json_mode, cov.kept_ids, cov.turn_parts, cov.result_parts})
      EXPECT_GT(n, kConversations / 20);
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(ChatTemplateConformance, Qwen3MatchesReference) {
  check_family(ChatFamily::kQwen3, testing::qwen3_dir(), /*from_config=*/true);
}

TEST(ChatTemplateConformance, Qwen3CoderMatchesReference) {
  check_family(ChatFamily::kQwen3Coder,
               std::filesystem::path(MEGADECODE_SOURCE_DIR) / "tests/data/qwen3_coder_chat_template.jinja",
               /*from_config=*/false);
}

TEST(ChatTemplateConformance, Cmd4MatchesReference) {
  check_family(ChatFamily::kCmd4, std::filesystem::path(MEGADECODE_SOURCE_DIR) / "tests/data/cmd4/cmd4-hf.jinja",
               /*from_config=*/false);
}

}  // namespace
}  // namespace megadecode
