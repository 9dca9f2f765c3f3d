// The command line's shape: which flags each verb takes, per-verb help, and the check that runs
// before absl parses anything, so that a flag a verb does not take, or a typo, is a usage error
// (exit 2) that says what was meant. Flags themselves are defined in main.cc.
#ifndef TALLY_CLIENT_CLI_H_
#define TALLY_CLIENT_CLI_H_

#include <string>
#include <vector>

namespace tally {

struct Verb {
  std::string name;
  std::string synopsis;               // "JOB... [--timeout S]"
  std::string summary;                // One line.
  std::vector<std::string> flags;     // Flag names (underscores) this verb takes.
};

// Every verb, in the order `tally help` lists them.
const std::vector<Verb>& Verbs();
const Verb* FindVerb(const std::string& name);

// What the pre-parse check found in argv (names normalised to underscores, as NormalizeFlagNames
// leaves them): the verb (the first positional word, "" if none), whether help or the version was
// asked for, and an error for a flag the verb does not take or that does not exist.
struct CommandLine {
  std::string verb;
  std::vector<std::string> positional;  // After the verb.
  bool help = false;
  bool version = false;
  std::string error;  // Non-empty: a usage error (exit 2).
};
CommandLine CheckCommandLine(const std::vector<std::string>& args);

// `tally VERB --help`: the verb's synopsis and its flags with their help and defaults.
std::string VerbHelp(const Verb& verb);
// `tally help`: every verb.
std::string GeneralHelp();
// `tally --version`.
std::string VersionText();

}  // namespace tally

#endif  // TALLY_CLIENT_CLI_H_
