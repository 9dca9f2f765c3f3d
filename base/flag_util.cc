#include "base/flag_util.h"

#include <algorithm>
#include <iostream>
#include <set>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_format.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace tally {

std::vector<std::string> NormalizeFlagNames(int argc, char** argv) {
  std::vector<std::string> out;
  bool flags_done = false;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (i > 0 && !flags_done && arg == "--") flags_done = true;
    if (i > 0 && !flags_done && arg.size() > 2 && arg[0] == '-' && arg[1] == '-') {
      const size_t end = arg.find('=');
      for (size_t k = 2; k < std::min(end, arg.size()); ++k) {
        if (arg[k] == '-') arg[k] = '_';
      }
    }
    out.push_back(arg);
  }
  return out;
}

std::vector<std::string> TakeRepeatedFlag(std::vector<std::string>* args, const std::string& name) {
  std::vector<std::string> values, kept;
  const std::string bare = "--" + name, with_value = bare + "=";
  for (size_t i = 0; i < args->size(); ++i) {
    const std::string& a = (*args)[i];
    if (a == "--") {
      kept.insert(kept.end(), args->begin() + static_cast<std::ptrdiff_t>(i), args->end());
      break;
    }
    if (a.rfind(with_value, 0) == 0) {
      values.push_back(a.substr(with_value.size()));
    } else if (a == bare && i + 1 < args->size()) {
      values.push_back((*args)[++i]);
    } else {
      kept.push_back(a);
    }
  }
  *args = std::move(kept);
  return values;
}

std::vector<char*> ArgvPointers(std::vector<std::string>& args) {
  std::vector<char*> out;
  for (std::string& a : args) out.push_back(a.data());
  return out;
}

absl::StatusOr<std::vector<float>> ParseFloatList(const std::string& flag, const std::string& value) {
  std::vector<float> out;
  for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
    float v = 0;
    if (!absl::SimpleAtof(part, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", part, "' is not a number"));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::vector<double>> ParseDoubleList(const std::string& flag, const std::string& value) {
  std::vector<double> out;
  for (absl::string_view part : absl::StrSplit(value, ',', absl::SkipWhitespace())) {
    double v = 0;
    if (!absl::SimpleAtod(part, &v)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": '", part, "' is not a number"));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::pair<int, int>> ParseSize(const std::string& flag, const std::string& value) {
  std::vector<std::string> parts = absl::StrSplit(value, absl::ByAnyChar("x,X"));
  int h = 0, w = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &h) || !absl::SimpleAtoi(parts[1], &w) || h <= 0 || w <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": expected HxW such as 512x512, got '", value, "'"));
  }
  return std::make_pair(h, w);
}

std::vector<std::string> FlagsDefinedIn(const std::string& main_file) {
  std::vector<std::string> out;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::EndsWith(flag->Filename(), main_file)) out.emplace_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string GroupedFlagHelp(const std::string& usage, const std::vector<FlagGroup>& groups,
                            const std::string& main_file) {
  const std::vector<std::string> defined = FlagsDefinedIn(main_file);
  std::set<std::string> listed;
  std::string out = usage + "\n";
  auto section = [&](const std::string& title, const std::vector<std::string>& flags) {
    std::string text;
    for (const std::string& name : flags) {
      const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
      if (f == nullptr || !std::binary_search(defined.begin(), defined.end(), name)) continue;
      listed.insert(name);
      const std::string def = f->DefaultValue();
      absl::StrAppend(&text, "  --", absl::StrReplaceAll(name, {{"_", "-"}}), "\n      ", f->Help(),
                      def.empty() || def == "\"\"" ? "" : absl::StrCat(" (default: ", def, ")"), "\n");
    }
    if (!text.empty()) absl::StrAppend(&out, "\n", title, ":\n", text);
  };
  for (const FlagGroup& g : groups) section(g.title, g.flags);
  std::vector<std::string> rest;
  for (const std::string& name : defined) {
    if (listed.count(name) == 0) rest.push_back(name);
  }
  section("Other", rest);
  out += "\nFlags accept dashes or underscores (--state-dir = --state_dir). --helpfull lists every library's flags too.\n";
  return out;
}

std::string ToolFlagHelp(const std::string& usage, const std::string& main_file) {
  return GroupedFlagHelp(usage, {{"Flags", FlagsDefinedIn(main_file)}}, main_file);
}

bool ParseToolFlags(int argc, char** argv, const std::string& usage, const std::string& main_file) {
  std::vector<std::string> normalized = NormalizeFlagNames(argc, argv);
  if (AsksForHelp(normalized)) {
    std::cout << ToolFlagHelp(usage, main_file);
    return false;
  }
  std::vector<char*> args = ArgvPointers(normalized);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  return true;
}

bool AsksForHelp(const std::vector<std::string>& args) {
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    if (args[i] == "--help" || args[i] == "-h" || args[i] == "-help" || args[i] == "--helpshort") return true;
  }
  return false;
}

absl::StatusOr<int64_t> ParseByteSize(const std::string& flag, const std::string& value) {
  static const std::pair<const char*, double> kUnits[] = {
      {"tib", 1099511627776.0}, {"gib", 1073741824.0}, {"mib", 1048576.0}, {"kib", 1024.0},
      {"tb", 1e12}, {"gb", 1e9}, {"mb", 1e6}, {"kb", 1e3},
      {"t", 1099511627776.0}, {"g", 1073741824.0}, {"m", 1048576.0}, {"k", 1024.0}, {"b", 1.0}};
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  absl::string_view number = lower;
  double scale = 1;
  for (const auto& [suffix, factor] : kUnits) {
    if (absl::ConsumeSuffix(&number, suffix)) {
      scale = factor;
      break;
    }
  }
  double x = 0;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(number), &x) || !(x > 0) || x * scale > 9.0e18) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": expected a size such as 1GiB, 512MiB or 2000000000, got '",
                                                   value, "'"));
  }
  return static_cast<int64_t>(x * scale);
}

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1073741824.0) return absl::StrFormat("%.1f GiB", b / 1073741824.0);
  return absl::StrFormat("%.0f MiB", b / 1048576.0);
}

}  // namespace tally
