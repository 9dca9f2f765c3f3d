// CUDA's initialisation started before main() in a GPU tally-worker, so that it overlaps the loading of LibTorch.
//
// A GPU worker's process spends ~0.3 s in LibTorch's static initialisers before main() runs, and
// CUDA's initialisation (the driver, then the device's primary context) takes another ~0.3 s that
// nothing before it needs. early_cuda.cc puts a function in the executable's .preinit_array, which
// the dynamic loader runs before any shared library's initialiser: when the command line asks for
// `--device cuda[:N]`, it starts a thread that loads the driver (libcuda.so.1, by dlopen: no link
// dependency), calls cuInit and retains device N's primary context, the one the CUDA runtime and
// LibTorch use. By the time the worker checks its device, that work is done or under way; whatever
// fails here is left to that check, which reports it. TALLY_EARLY_CUDA=0 turns it off.
//
// Only the tally-worker executable links early_cuda.cc (a .preinit_array entry is ignored in a
// shared library); CPU-only builds compile it to nothing.
#ifndef TALLY_WORKER_EARLY_CUDA_H_
#define TALLY_WORKER_EARLY_CUDA_H_

namespace tally {

// The CUDA device ordinal that a tally-worker command line names with `--device cuda[:N]` (as
// `--device=V` or `--device V`, any number of leading dashes), or -1: none, another device, a
// malformed one, or a command that only prints (--version, --help...). Plain C string handling:
// it runs before libstdc++ is initialised.
int EarlyCudaOrdinal(int argc, char** argv);

// Waits for the early initialisation thread, if one was started (idempotent, thread-safe). main()
// registers it with atexit first thing, so the process never exits while that thread is inside the
// driver.
void JoinEarlyCuda();

}  // namespace tally

#endif  // TALLY_WORKER_EARLY_CUDA_H_
