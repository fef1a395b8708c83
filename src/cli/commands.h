// The subcommands of the `megadecode` binary; each lives in src/cli/cmd_<name>.cpp and receives the
// arguments after its name. Return value: the process exit code.
#pragma once

namespace megadecode {

int cmd_generate(int argc, char** argv);
int cmd_make_model(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_plan(int argc, char** argv);
int cmd_serve(int argc, char** argv);
int cmd_bench(int argc, char** argv);

}  // namespace megadecode
