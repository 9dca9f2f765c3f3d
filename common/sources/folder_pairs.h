// Rows from folders (docs/data.md "Two folders"): the files of two folders paired by name into a
// manifest, which the job keeps (so a report names the manifest it was built from) and reads as any
// other (common/sources/manifest.h ManifestReader::FromText). Two conventions:
//  - images and masks (`--images DIR --masks DIR [--mask-suffix S]`, tallyd pairs them at
//    submission): files paired by their path below the folder without its extension, masks ending
//    in the suffix before it; what is left unpaired is named in the job's warnings, and an image whose
//    name no manifest can hold (invalid UTF-8, CR/LF) is a failed row naming it.
//  - nnU-Net's predictions and references (`tally run --predictions DIR --references DIR`): files
//    ending in --file-ending paired by identical name. A reference without a prediction fails the
//    run before it starts (naming them: a missing prediction is the model's failure, and nnU-Net
//    refuses too); predictions without a reference are not evaluated, and one warning with their
//    count and names is kept among the report's warnings (JobSpec.client_warnings).
#ifndef TALLY_COMMON_SOURCES_FOLDER_PAIRS_H_
#define TALLY_COMMON_SOURCES_FOLDER_PAIRS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/sources/row_source.h"

namespace tally {

// A folder pairing's manifest (CSV text with absolute paths) and what it left out.
struct PairedFolders {
  std::string manifest;
  int64_t pairs = 0;
  std::vector<std::string> warnings;
  // Images whose path cannot be written into a manifest or a report (not valid UTF-8, or holding a
  // control character such as CR or LF): rows of their own after the manifest's, each failing with
  // the file's name (escaped) and why. Masks with such names are named in a warning.
  std::vector<ManifestRow> failed;
  int64_t images = 0;  // Image files found (paired or not).
  // Where images went unpaired: the suffix most of the unpaired masks carry before their extension
  // that would pair them ("_mask"); "" when none does.
  std::string suggested_suffix;
};

// Images and masks: walks both folders (not following links to folders; hidden entries skipped),
// through the data roots; more than `max_files` files in one is an error (tallyd
// --max-manifest-rows). No pair (and no failed image) at all is an error naming both folders and
// the suffix, as is a --mask-suffix that no mask carries; either says which suffix the masks seem to
// carry where one would pair most of them (PairedFolders::suggested_suffix).
absl::StatusOr<PairedFolders> PairImagesAndMasks(const std::string& images_dir, const std::string& masks_dir,
                                                 const std::string& mask_suffix, size_t max_files);

// nnU-Net's convention.
struct FolderPairs {
  std::vector<std::string> names;            // Paired file names, sorted.
  std::vector<std::string> only_references;  // Sorted.
  std::vector<std::string> only_predictions;
  // Files whose names no manifest can hold (invalid UTF-8, control characters), as "prediction
  // 'a\xE9.nii.gz' (why)": not paired, named in a warning.
  std::vector<std::string> odd;
};
absl::StatusOr<FolderPairs> ListPairs(const std::string& predictions, const std::string& references,
                                      const std::string& file_ending);
// Pairs the folders and writes the manifest (columns id, mask, prediction; absolute paths) into
// `state_dir`; returns its path and sets `warnings` (also printed on stderr).
absl::StatusOr<std::string> PairFolders(const std::string& predictions, const std::string& references,
                                        const std::string& file_ending, const std::string& state_dir,
                                        std::vector<std::string>* warnings);

}  // namespace tally

#endif  // TALLY_COMMON_SOURCES_FOLDER_PAIRS_H_
