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

}  // namespace tally
