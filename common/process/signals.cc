#include "common/process/signals.h"

#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tally {
namespace {
sigset_t TerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}
std::atomic<bool> g_dumping{false};       // A dump is going on: SIGQUIT now means "print yours".
std::atomic_flag g_writing = ATOMIC_FLAG_INIT;  // One thread's stack at a time on stderr.

void WriteAll(const char* text, size_t n) {
  while (n > 0) {
    const ssize_t w = write(STDERR_FILENO, text, n);
    if (w <= 0) return;
    text += w;
    n -= static_cast<size_t>(w);
  }
}

void PrintThisThreadsStack() {
  void* frames[64];
  const int n = backtrace(frames, 64);
  const long tid = syscall(SYS_gettid);
  char name[32] = "?";
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/task/%ld/comm", tid);
  if (FILE* f = fopen(path, "r")) {
    if (fgets(name, sizeof(name), f) == nullptr) strcpy(name, "?");
    fclose(f);
    name[strcspn(name, "\n")] = '\0';
  }
  while (g_writing.test_and_set(std::memory_order_acquire)) {
  }
  char header[128];
  const int len = snprintf(header, sizeof(header), "--- thread %ld (%s):\n", tid, name);
  WriteAll(header, static_cast<size_t>(len));
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  g_writing.clear(std::memory_order_release);
}

void OnQuitSignal(int) {
  if (g_dumping.exchange(true)) {  // Sent on by the first thread.
    PrintThisThreadsStack();
    return;
  }
  const char start[] = "=== SIGQUIT: every thread's stack (addr2line -f -C -e BINARY OFFSET for offsets)\n";
  WriteAll(start, sizeof(start) - 1);
  PrintThisThreadsStack();
  const long self = syscall(SYS_gettid);
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* e = readdir(dir)) {
      const long tid = std::strtol(e->d_name, nullptr, 10);
      if (tid > 0 && tid != self) syscall(SYS_tgkill, getpid(), tid, SIGQUIT);
    }
    closedir(dir);
  }
  const timespec wait = {1, 0};  // For the others to print theirs.
  nanosleep(&wait, nullptr);
  const char end[] = "=== end of stacks\n";
  WriteAll(end, sizeof(end) - 1);
  g_dumping = false;
}
}  // namespace

void DumpStacksOnQuitSignal() {
  void* warm[1];
  backtrace(warm, 1);  // Loads the unwinder now, not inside the handler.
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = OnQuitSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGQUIT, &action, nullptr);
}

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
