// serve_until_shutdown: the serve loop's signal and failure handling (see shutdown.h).
#include "server/shutdown.h"

#include <cerrno>
#include <ctime>

#include "core/log.h"

namespace megadecode {

namespace {

using Clock = std::chrono::steady_clock;

// A signal of `signals` within `timeout`, else 0.
int wait_signal(const sigset_t& signals, std::chrono::milliseconds timeout) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
  const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  for (;;) {
    const int sig = sigtimedwait(&signals, nullptr, &ts);
    if (sig > 0) return sig;
    if (errno != EINTR) return 0;  // EAGAIN: the timeout
  }
}

// Waits until done() or the deadline, looking for a signal meanwhile; returns the signal or 0.
template <class Done>
int wait_until(Done done, Clock::time_point deadline, const sigset_t& signals, const ShutdownOptions& o) {
  while (!done() && Clock::now() < deadline)
    if (const int sig = wait_signal(signals, o.poll)) return sig;
  return 0;
}

}  // namespace

int ServeOutcome::exit_code() const {
  switch (end) {
    case ServeEnd::kDrained: return 0;
    case ServeEnd::kSecondSignal: return 128 + signal;
    case ServeEnd::kEngineFailed: return 1;
  }
  return 1;
}

ServeOutcome serve_until_shutdown(HttpServer& http, Engine& engine, const sigset_t& signals,
                                  const ShutdownOptions& options) {
  ServeOutcome out;
  auto written = [&] { return http.n_in_flight() == 0; };
  while (out.signal == 0 && !engine.failed()) out.signal = wait_signal(signals, options.poll);

  if (out.signal != 0) {
    log_info("signal ", out.signal, ": draining for up to ",
             std::chrono::duration<double>(options.drain_timeout).count(), " s (a second signal ends at once)");
    engine.drain();
    http.begin_drain();
    const auto drained = [&] { return engine.failed() || (engine.idle() && written()); };
    if (const int sig = wait_until(drained, Clock::now() + options.drain_timeout, signals, options)) {
      log_warn("signal ", sig, ": exiting at once");
      return ServeOutcome{ServeEnd::kSecondSignal, sig, ""};
    }
    if (!engine.idle() && !engine.failed()) log_warn("drain timeout: ending the requests still in flight");
  }
  if (engine.failed()) {
    out.end = ServeEnd::kEngineFailed;
    out.failure = engine.failure();
    http.begin_drain();
  }
  engine.stop();  // ends what is left: error events and bodies, posted to the connections
  if (const int sig = wait_until(written, Clock::now() + options.flush_timeout, signals, options)) {
    log_warn("signal ", sig, ": exiting at once");
    return ServeOutcome{ServeEnd::kSecondSignal, sig, ""};
  }
  http.stop();
  log_info(out.end == ServeEnd::kDrained ? "shut down" : "stopped after the engine failed");
  return out;
}

}  // namespace megadecode
