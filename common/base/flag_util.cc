#include "common/base/flag_util.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

}  // namespace tally
