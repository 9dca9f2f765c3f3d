// 3D label volumes: NIfTI-1 and NIfTI-2 (.nii, .nii.gz) through nifti_clib (Debian's
// libnifti2-dev), as nnU-Net and MONAI write their predictions.
//
// Axes: NIfTI stores i fastest, then j, then k. Tally names them x = i (dim[1]), y = j (dim[2]),
// z = k (dim[3]); a volume's labels are row-major (z, y, x), i.e. the file's own order, and its
// spacing (z, y, x) is (pixdim[3], pixdim[2], pixdim[1]). nibabel's array of the same file has the
// shape (x, y, z) and zooms (pixdim[1], pixdim[2], pixdim[3]): the same voxels and distances.
//
// Labels: every NIfTI integer type, and float types whose values are all integers (MONAI's
// SaveImage writes float32 by default), after scl_slope/scl_inter when they scale. Values must lie
// in 0..65534 (kMaxMaskValue). Dimensions 4 to 7, when present, must be 1.
// Thread-safe (nifti_clib keeps no state between calls; its messages are silenced).
#ifndef TALLY_COMMON_IO_VOLUME_IO_H_
#define TALLY_COMMON_IO_VOLUME_IO_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/file_util.h"
#include "common/formats/decode.h"

namespace tally {

struct VolumeGeometry {
  int64_t depth = 1;   // z = dim[3]
  int64_t height = 0;  // y = dim[2]
  int64_t width = 0;   // x = dim[1]
  std::array<double, 3> spacing = {1, 1, 1};  // z, y, x
  // Voxel (i, j, k, 1) -> world (x, y, z): the sform when its code is set, else the qform, else
  // the pixdim diagonal. Rows 0..2 of the 4x4 matrix.
  std::array<std::array<double, 4>, 3> affine{};
  std::string affine_source = "pixdim";  // sform | qform | pixdim
  bool spacing_in_header = false;        // qform/sform set, or pixdim other than 1 (or 0).
};

// IsNiftiPath and VolumeChannelFiles: base/file_util.h (no NIfTI library needed).

// One image volume as the model reads it: voxels row-major (z, y, x), as float32 after the header's
// scl_slope/scl_inter, and (keep_raw) the stored bytes of type `dtype` (numpy's names: uint8, int8,
// int16, uint16, int32, uint32, int64, uint64, float32, float64) unscaled.
struct VolumeImage {
  VolumeGeometry geometry;
  std::vector<float> values;
  std::string dtype;
  std::vector<uint8_t> raw;
};
absl::Status LoadNiftiImage(const std::string& path, int64_t max_voxels, bool keep_raw, VolumeImage* out);

// Reads a label volume into `out` (labels row-major z, y, x; height/width/depth set) and its
// geometry. A header declaring more than `max_voxels` voxels fails before the data is read.
// Errors name the file and what is wrong with it.
absl::Status LoadNiftiLabels(const std::string& path, int64_t max_voxels, LabelMap* out, VolumeGeometry* geometry);

// What a label map's file declares before any pixel is read (a NIfTI header, a PNG's IHDR, a JPEG's
// frame header): its size, the bytes a voxel takes in the file once read (the NIfTI data type's
// size; 1 for PNG and JPEG, decoded 8 bits at a time), and the bytes of the file held in memory
// while it is decoded (a PNG's or JPEG's whole file; 0 for NIfTI, read as a stream). For memory
// estimates.
struct DeclaredSize {
  int64_t depth = 1, height = 0, width = 0;
  int64_t stored_bytes_per_voxel = 1;
  int64_t file_bytes = 0;
  int64_t voxels() const { return depth * height * width; }
};
// Errors as loading the file would give them (a path outside the data roots, not a regular file, a
// header that is no image's), naming the file; a declared size above `max_voxels` is an error too.
absl::StatusOr<DeclaredSize> ReadDeclaredSize(const std::string& path, int64_t max_voxels);

// Writes a label volume (tests, benchmarks, the demo). `datatype` is a NIfTI DT_* code of an
// integer type (or float32); `nifti2` writes the NIfTI-2 header. Names ending .gz are compressed.
absl::Status WriteNiftiLabels(const std::string& path, const VolumeGeometry& geometry, const uint16_t* labels,
                              int datatype, bool nifti2 = false);

// How far spacings and affines may differ and still agree: absolute, in the header's units, and
// relative for values above 1 (WithinTolerance).
inline constexpr double kGeometryTolerance = 1e-3;
bool WithinTolerance(double a, double b, double tolerance = kGeometryTolerance);

// Checks that a prediction's geometry matches its reference's: dimensions exactly; spacing and
// affine within `tolerance`. The error names both files and both values.
absl::Status CheckSameGeometry(const VolumeGeometry& ref, const std::string& ref_name, const VolumeGeometry& pred,
                               const std::string& pred_name, double tolerance = kGeometryTolerance);

}  // namespace tally

#endif  // TALLY_COMMON_IO_VOLUME_IO_H_
