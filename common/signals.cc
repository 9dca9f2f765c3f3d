#include "common/signals.h"

#include <signal.h>

namespace tally {
namespace {
sigset_t TerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}
}  // namespace

void BlockTerminationSignals() {
  const sigset_t signals = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

std::thread WaitForTerminationSignal(std::function<void(int)> on_signal) {
  return std::thread([on_signal = std::move(on_signal)] {
    const sigset_t signals = TerminationSignals();
    int sig = 0;
    sigwait(&signals, &sig);
    on_signal(sig);
  });
}

void BlockReloadSignal() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

void HandleReloadSignals(std::function<void()> on_reload) {
  std::thread([on_reload = std::move(on_reload)] {
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGHUP);
    while (true) {
      int sig = 0;
      if (sigwait(&signals, &sig) == 0) on_reload();
    }
  }).detach();
}

}  // namespace tally
