// tally export: a network as an AOTInductor package (.pt2) for the C++ runner, made by Tally's
// Python helper (python/tally/export.py, which says what the package takes and how it is checked)
// in the interpreter --python names. This verb finds the helper and hands over: its exit code and
// its output are the export's.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/verbs/verbs.h"
#include "common/process/subprocess.h"

namespace tally {

int ExportVerb(const ExportFlags& f) {
  if (!f.positional.empty()) {
    std::cerr << "tally export: unexpected argument '" << f.positional[0]
              << "'; usage: tally export --model M --input-size HxW --out net.pt2\n";
    return kExitUsage;
  }
  if (f.model.empty() || f.out.empty() || f.input_size.empty()) {
    std::cerr << "tally export: --model, --input-size and --out are required (tally help export)\n";
    return kExitUsage;
  }
  const std::string dir = PythonPackageDir();
  if (dir.empty()) {
    std::cerr << "tally export: Tally's Python package (python/tally/export.py) was not found on this host; set "
                 "TALLY_PYTHON_DIR to the repository's python/ folder\n";
    return kExitFailed;
  }
  const std::string python = f.python.empty() ? "python3" : f.python;
  std::vector<std::string> args = {python,          "-m", "tally.export", "--model", f.model, "--out", f.out,
                                   "--input-size", f.input_size};
  if (!f.batch_size.empty()) args.insert(args.end(), {"--batch-size", f.batch_size});
  if (!f.precision.empty()) args.insert(args.end(), {"--precision", f.precision});
  if (!f.cxx.empty()) args.insert(args.end(), {"--cxx", f.cxx});
  for (const std::string& o : f.model_options) args.insert(args.end(), {"--model-option", o});
  const char* old = std::getenv("PYTHONPATH");
  const std::string path = (old != nullptr && *old != '\0') ? absl::StrCat(dir, ":", old) : dir;
  setenv("PYTHONPATH", path.c_str(), 1);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  std::cerr << "tally export: cannot run '" << python << "': " << std::strerror(errno)
            << " (--python names the interpreter with torch 2.6 or newer)\n";
  return kExitFailed;
}

}  // namespace tally
