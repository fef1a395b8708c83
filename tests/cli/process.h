// Running the `megadecode` binary from a test: once to completion (stdout, stderr, exit code), or
// as a server in the background (its port read from its log, signals sent to it, its exit
// awaited with a bound). The binary sits next to the test executable (one build directory).
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace megadecode::testing {

inline std::filesystem::path megadecode_binary() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path() / "megadecode";
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A child process of the binary with stdout and stderr in files of a scratch directory.
class Process {
 public:
  explicit Process(const std::vector<std::string>& args, const std::vector<std::string>& env_extra = {}) {
    static int counter = 0;
    dir_ = std::filesystem::temp_directory_path() /
           ("megadecode_proc_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(dir_);
    std::vector<std::string> argv_s = {megadecode_binary().string()};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_s;
    for (char** e = environ; *e != nullptr; ++e) env_s.emplace_back(*e);
    env_s.insert(env_s.end(), env_extra.begin(), env_extra.end());
    std::vector<char*> envp;
    for (std::string& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, (dir_ / "stdout").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&actions, 2, (dir_ / "stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);  // the child starts with no signal blocked
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    spawned_ = posix_spawn(&pid_, argv[0], &actions, &attr, argv.data(), envp.data()) == 0;
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
  ~Process() {
    if (spawned_ && !status_) {
      ::kill(pid_, SIGKILL);
      wait_exit(std::chrono::seconds(10));
    }
    std::filesystem::remove_all(dir_);
  }
  bool spawned() const { return spawned_; }
  void signal(int sig) const { ::kill(pid_, sig); }
  std::string out() const { return read_file(dir_ / "stdout"); }
  std::string err() const { return read_file(dir_ / "stderr"); }

  // The exit code (128 + N when killed by signal N), or nullopt when still running after timeout.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!status_) {
      int st = 0;
      const pid_t r = ::waitpid(pid_, &st, WNOHANG);
      if (r == pid_) {
        status_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        break;
      }
      if (r < 0 || std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return status_;
  }

  // The port a server announces in its log ("... on http://HOST:PORT"), or 0 after the timeout.
  int wait_port(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline && !wait_exit(std::chrono::milliseconds(0))) {
      const std::string log = err();
      for (const char* scheme : {"on http://", "on https://"}) {
        const size_t at = log.find(scheme);
        if (at == std::string::npos) continue;
        const size_t colon = log.find(':', at + std::string(scheme).size());
        if (colon != std::string::npos) return std::atoi(log.c_str() + colon + 1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return 0;
  }

 private:
  std::filesystem::path dir_;
  pid_t pid_ = -1;
  bool spawned_ = false;
  std::optional<int> status_;
};

}  // namespace megadecode::testing
