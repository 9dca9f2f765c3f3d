// Shutdown on SIGINT/SIGTERM for the long-running mains (tallyd, tally-worker): the signals are
// blocked in every thread and one thread waits for them with sigwait.
#ifndef TALLY_COMMON_SIGNALS_H_
#define TALLY_COMMON_SIGNALS_H_

#include <functional>
#include <thread>

namespace tally {

// Call first thing in main(), before any thread starts, so that every thread inherits the mask.
void BlockTerminationSignals();
// A thread that waits for SIGINT or SIGTERM and then calls `on_signal(signal)` once.
std::thread WaitForTerminationSignal(std::function<void(int)> on_signal);

// SIGHUP as "reload your configuration" (tallyd): block it first thing in main(), then start a
// detached thread that calls `on_reload()` for every SIGHUP.
void BlockReloadSignal();
void HandleReloadSignals(std::function<void()> on_reload);

}  // namespace tally

#endif  // TALLY_COMMON_SIGNALS_H_
