// Shutdown on SIGINT/SIGTERM for the long-running mains (tallyd, tally-worker): the signals are
// blocked in every thread and one thread waits for them with sigwait.
#ifndef TALLY_COMMON_PROCESS_SIGNALS_H_
#define TALLY_COMMON_PROCESS_SIGNALS_H_

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

// SIGQUIT (kill -QUIT PID) as "print every thread's stack to stderr" for the long-running mains, to
// see where a stuck process waits without a debugger: the first thread to get it sends it on to the
// others; each prints its thread id, name and return addresses (backtrace_symbols_fd: functions
// local to the executable show as offsets, for `addr2line -f -C -e BINARY OFFSET`). The process
// goes on. Call once, early in main().
void DumpStacksOnQuitSignal();

}  // namespace tally

#endif  // TALLY_COMMON_PROCESS_SIGNALS_H_
