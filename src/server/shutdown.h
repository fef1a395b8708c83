// How `megadecode serve` ends. It serves until SIGINT or SIGTERM, or until the engine fails:
//   - the first signal starts the drain: the engine takes no new work (new requests get 503 +
//     Retry-After, /health 503), every response closes its connection, and requests in flight go
//     on for up to drain_timeout; then the engine ends what is left (a stream gets an error event
//     and `data: [DONE]`, a whole response an error body), the answers are written (at most
//     flush_timeout), and the server stops: exit code 0;
//   - a second signal during the drain ends it at once (kSecondSignal: the caller _Exits);
//   - a backend failure (engine.h) has already ended every request with an error; once those
//     answers are written the server stops: exit code 1, so that a supervisor restarts it.
// Threading: call from the owner thread with `signals` blocked in every thread (block them before
// any thread starts, so that only this function's sigtimedwait() receives them).
#pragma once

#include <signal.h>

#include <chrono>
#include <string>

#include "engine/engine.h"
#include "server/http_server.h"

namespace megadecode {

struct ShutdownOptions {
  std::chrono::milliseconds drain_timeout{30000};  // --shutdown-timeout
  std::chrono::milliseconds flush_timeout{5000};   // for the last answers to be written
  std::chrono::milliseconds poll{20};              // how often the engine's state is looked at
};

enum class ServeEnd { kDrained, kSecondSignal, kEngineFailed };

struct ServeOutcome {
  ServeEnd end = ServeEnd::kDrained;
  int signal = 0;       // the last signal received, 0 when none
  std::string failure;  // kEngineFailed: the backend's failure
  int exit_code() const;  // 0 drained, 128 + signal after a second signal, 1 after a failure
};

ServeOutcome serve_until_shutdown(HttpServer& http, Engine& engine, const sigset_t& signals,
                                  const ShutdownOptions& options = {});

}  // namespace megadecode
