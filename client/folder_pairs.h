// nnU-Net's folder convention for `tally run --predictions DIR --references DIR`: files ending in
// --file-ending are paired by identical name. A reference without a prediction fails the run
// before it starts (naming them: a missing prediction is the model's failure, and nnU-Net refuses
// too); predictions without a reference are not evaluated, and one warning with their count and
// names is printed and kept among the report's warnings (JobSpec.client_warnings).
#ifndef TALLY_CLIENT_FOLDER_PAIRS_H_
#define TALLY_CLIENT_FOLDER_PAIRS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tally {

struct FolderPairs {
  std::vector<std::string> names;            // Paired file names, sorted.
  std::vector<std::string> only_references;  // Sorted.
  std::vector<std::string> only_predictions;
};

absl::StatusOr<FolderPairs> ListPairs(const std::string& predictions, const std::string& references,
                                      const std::string& file_ending);

// Pairs the folders and writes the manifest (columns id, mask, prediction; absolute paths) into
// `state_dir`; returns its path and sets `warnings` (also printed on stderr).
absl::StatusOr<std::string> PairFolders(const std::string& predictions, const std::string& references,
                                        const std::string& file_ending, const std::string& state_dir,
                                        std::vector<std::string>* warnings);

}  // namespace tally

#endif  // TALLY_CLIENT_FOLDER_PAIRS_H_
