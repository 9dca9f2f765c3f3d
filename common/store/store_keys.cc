#include "common/store/store_keys.h"

#include <sys/stat.h>

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "common/security/sha256.h"
#include "common/sources/row_files.h"

namespace tally {
namespace {

constexpr int kMaxDigestedFiles = 100000;  // Files of one --model-option folder that are digested.

// Adds a file's, or a folder's files' (sorted, recursively), digests and names to `text`.
absl::Status DigestPath(const std::string& path, int* files, std::string* text) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return absl::OkStatus();  // Not a path: the option's value alone.
  if (S_ISREG(st.st_mode)) {
    if (++*files > kMaxDigestedFiles) {
      return absl::ResourceExhaustedError(absl::StrCat("--prediction-store: more than ", kMaxDigestedFiles,
                                                       " files under a --model-option path to digest"));
    }
    ASSIGN_OR_RETURN(FileFacts f, DigestFile(path));
    absl::StrAppend(text, path, "=", Hex128(f.xxh128), "\n");
    return absl::OkStatus();
  }
  if (!S_ISDIR(st.st_mode)) return absl::OkStatus();
  for (const std::string& n : ListDirectory(path)) RETURN_IF_ERROR(DigestPath(path + "/" + n, files, text));
  return absl::OkStatus();
}

// The .py files beside a Python model (it may import them), sorted.
std::vector<std::string> SiblingSources(const std::string& model_path) {
  const std::string folder = model_path.substr(0, model_path.rfind('/') + 1);
  std::vector<std::string> out;
  for (const std::string& name : ListDirectory(folder.empty() ? "." : folder)) {
    if (absl::EndsWith(name, ".py")) out.push_back(folder + name);
  }
  return out;
}


// Volume jobs' lines: what the volume's voxels go through and how the model sees them.
std::string VolumeSettingsText(const JobConfig& config) {
  // Numbers as the values they are (clip:0,1000 and clip:0.0,1e3 are one setting).
  const std::string intensity = config.intensity == JobConfig::Intensity::kClip
                                    ? absl::StrFormat("clip:%.17g,%.17g", config.clip_low, config.clip_high)
                                    : config.intensity_name;
  return absl::StrCat("volume on\nintensity ", intensity, "\nsliding_window ", absl::StrJoin(config.sliding_window, ","),
                      "\noverlap ", absl::StrFormat("%.17g", config.overlap), "\nsw_batch ", config.sw_batch_size,
                      "\nkeep_dtype ", config.keep_dtype ? "on" : "off", "\n");
}

}  // namespace

absl::StatusOr<std::string> PredictionModelDigest(const JobConfig& config, const std::string& model_sha256) {
  const ModelRef model = ParseModelRef(config.model);
  if (!model.python) return model_sha256.empty() ? Sha256FileHex(model.path) : model_sha256;
  std::string text = absl::StrCat("python model ", model.class_name, "\ninterpreter ",
                                  config.python.empty() ? "python3" : config.python, "\n");
  int files = 0;
  for (const std::string& source : SiblingSources(model.path)) RETURN_IF_ERROR(DigestPath(source, &files, &text));
  for (const auto& [k, v] : config.model_options) {
    absl::StrAppend(&text, "option ", k, "=", v, "\n");
    RETURN_IF_ERROR(DigestPath(v, &files, &text));
  }
  return Sha256Hex(text);
}

std::string JobSettingsText(const JobConfig& config) {
  std::vector<std::string> map;
  for (const auto& [from, to] : config.label_map) map.push_back(absl::StrCat(from, ":", to));
  return absl::StrCat("precision ", PrecisionName(config.precision), "\ninput ", config.input_height, "x",
                      config.input_width, "\nmean ", absl::StrJoin(config.mean, ","), "\nstd ",
                      absl::StrJoin(config.std, ","), "\nlabel_map ", absl::StrJoin(map, ","), "\ncompile ",
                      config.compile ? "on" : "off", "\n",
                      config.window.given()
                          ? absl::StrFormat("window %.17g,%.17g\n", config.window.center, config.window.width)
                          : "",
                      config.volume_inputs ? VolumeSettingsText(config) : "");
}

std::string RunSettingsText(const JobConfig& config, bool cuda, const std::string& gpu_name, int batch_size,
                            bool channels_last, bool nvjpeg) {
  // GPU kernels may change with the batch's size; on the CPU Tally's outputs do not.
  return absl::StrCat("decode ", config.decode_mode, config.decode_gpu ? " gpu" : " cpu", "\ndevice ",
                      cuda ? "cuda " : "cpu ", gpu_name, "\nbatch ", cuda ? batch_size : 0, "\nlayout ",
                      channels_last ? "channels-last" : "contiguous", "\njpeg ", nvjpeg ? "nvjpeg" : "host", "\n");
}

}  // namespace tally
