// `megadecode tokenize --model DIR [--decode] [--chat] [--text T] [--skip-special-tokens]
//  [--no-generation-prompt]`: text <-> token ids with the model's tokenizer.
//   default   encode the text (stdin, verbatim, or --text) and print the ids comma-separated
//   --decode  read ids (separated by commas or whitespace) and print the text
//   --chat    read a JSON list of OpenAI chat messages (tool calls and tool results included),
//             print the prompt the model's chat template renders (with the assistant generation
//             prompt unless --no-generation-prompt), then its ids
#include <cstdio>
#include <iostream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/args.h"
#include "core/check.h"
#include "server/chat_request.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace megadecode {
namespace {

constexpr const char* kUsage =
    "usage: megadecode tokenize --model DIR [--text T] [--decode [--skip-special-tokens]]\n"
    "                           [--chat [--no-generation-prompt]]\n"
    "  default   encode the text (stdin, or --text) and print the ids comma-separated\n"
    "  --decode  read ids (separated by commas or whitespace) and print the text\n"
    "  --chat    read a JSON list of OpenAI chat messages, print the prompt the model's chat template\n"
    "            renders (with the assistant generation prompt unless --no-generation-prompt), then its ids\n";

std::string read_input(const Args& args) {
  if (args.has("text")) return args.get("text", "");
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string item;
  auto flush = [&] {
    if (item.empty()) return;
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MD_REQUIRE(used == item.size() && v >= INT32_MIN && v <= INT32_MAX, "not a token id: \"", item, "\"");
    ids.push_back(static_cast<int32_t>(v));
    item.clear();
  };
  for (const char c : text) {
    if (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '[' || c == ']') {
      flush();
    } else {
      item += c;
    }
  }
  flush();
  return ids;
}

ChatInput parse_chat(const std::string& text, bool add_generation_prompt) {
  const RequestJson j = RequestJson::parse(text, nullptr, false);
  MD_REQUIRE(!j.is_discarded(), "--chat expects a JSON list of messages");
  ChatInput chat;
  try {
    chat.messages = parse_messages(j);
  } catch (const ApiError& e) {
    throw Error(cat("--chat: ", e.what()));
  }
  chat.add_generation_prompt = add_generation_prompt;
  return chat;
}

void print_ids(const std::vector<int32_t>& ids) {
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) line += ',';
    line += std::to_string(ids[i]);
  }
  std::printf("%s\n", line.c_str());
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  const Args args(argc, argv, {"model", "text"}, {"decode", "chat", "skip-special-tokens", "no-generation-prompt", "help"});
  if (args.flag("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  MD_REQUIRE(!(args.flag("decode") && args.flag("chat")), "--decode and --chat exclude each other");
  const std::unique_ptr<Tokenizer> tok = Tokenizer::load(args.require("model"));
  const std::string input = read_input(args);
  if (args.flag("decode")) {
    const std::string text = tok->decode(parse_ids(input), args.flag("skip-special-tokens"));
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::printf("\n");
  } else if (args.flag("chat")) {
    const ChatInput chat = parse_chat(input, !args.flag("no-generation-prompt"));
    const std::string prompt = ChatTemplate::load(args.require("model")).render(chat);
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    print_ids(tok->encode(prompt, true));
  } else {
    print_ids(tok->encode(input, true));
  }
  return 0;
}

}  // namespace megadecode
