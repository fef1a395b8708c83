// megadecode: one binary, several subcommands (vLLM-style flags where the meaning is the same).
// Help (--help, -h, here and in every command) goes to stdout with exit code 0; usage after a
// mistake goes to stderr with a non-zero exit code.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "cli/commands.h"
#include "core/check.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* help;
};

constexpr Command kCommands[] = {
    {"serve", megadecode::cmd_serve, "serve MODEL_DIR: OpenAI-compatible HTTP server"},
    {"generate", megadecode::cmd_generate, "generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3): stream tokens"},
    {"bench", megadecode::cmd_bench, "bench decode|serve|tokenizer: benchmarks that print tables and write JSON"},
    {"make-model", megadecode::cmd_make_model, "make-model --preset NAME --seed S --out DIR: synthetic HF checkpoint"},
    {"tokenize", megadecode::cmd_tokenize, "tokenize --model DIR [--decode] [--chat]: text <-> token ids"},
    {"plan", megadecode::cmd_plan, "plan --model DIR --batch B --context L --policy P: decode plan statistics"},
};

void usage(std::FILE* out) {
  std::fprintf(out, "usage: megadecode COMMAND [ARGS]   (megadecode COMMAND --help: its flags)\n\ncommands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-11s %s\n", c.name, c.help);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    usage(stdout);
    return 0;
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    try {
      return c.run(argc - 2, argv + 2);
    } catch (const megadecode::Error& e) {
      std::fprintf(stderr, "megadecode %s: error: %s\n", c.name, e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "megadecode %s: unexpected error: %s\n", c.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "megadecode: unknown command \"%s\"\n", argv[1]);
  usage(stderr);
  return 2;
}
