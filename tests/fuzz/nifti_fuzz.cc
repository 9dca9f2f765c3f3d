// NIfTI-1/2 files on arbitrary bytes (the header through nifti_clib, the voxels read by
// Tally after it): no crash and no allocation past the voxel limit; a volume that loads holds
// exactly its declared voxels, every label a finite integer in range.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "common/formats/volume.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // nifti_clib reads files by name: the input goes to a file of this process's own.
  static const std::string path = "/tmp/tally_nifti_fuzz_" + std::to_string(getpid()) + ".nii";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  tally::LabelMap labels;
  tally::VolumeGeometry g;
  if (tally::LoadNiftiLabels(path, kFuzzMaxPixels, &labels, &g).ok()) {
    FUZZ_CHECK(static_cast<int64_t>(labels.labels.size()) == g.depth * g.height * g.width);
    for (uint16_t v : labels.labels) FUZZ_CHECK(v <= tally::kMaxMaskValue);
  }
  tally::VolumeImage image;
  if (tally::LoadNiftiImage(path, kFuzzMaxPixels, false, &image).ok()) {
    FUZZ_CHECK(static_cast<int64_t>(image.values.size()) ==
               image.geometry.depth * image.geometry.height * image.geometry.width);
  }
  absl::StatusOr<tally::DeclaredSize> d = tally::ReadDeclaredSize(path, kFuzzMaxPixels);
  if (d.ok()) FUZZ_CHECK(d->voxels() <= kFuzzMaxPixels);
  return 0;
}
