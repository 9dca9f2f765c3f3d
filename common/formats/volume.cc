#include "common/formats/volume.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <type_traits>

#include <unistd.h>
#include <zlib.h>

#include <cstdlib>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/security/data_roots.h"
#include "base/checked_math.h"
#include "base/file_util.h"
#include "base/status_macros.h"

extern "C" {
#include "nifti2_io.h"
}

namespace tally {
namespace {

void QuietNifti() {
  static std::once_flag once;
  std::call_once(once, [] { nifti_set_debug_level(0); });
}

struct NimDeleter {
  void operator()(nifti_image* nim) const { nifti_image_free(nim); }
};
using NimPtr = std::unique_ptr<nifti_image, NimDeleter>;

bool IsIntegerType(int dt) {
  switch (dt) {
    case NIFTI_TYPE_UINT8: case NIFTI_TYPE_INT8: case NIFTI_TYPE_INT16: case NIFTI_TYPE_UINT16:
    case NIFTI_TYPE_INT32: case NIFTI_TYPE_UINT32: case NIFTI_TYPE_INT64: case NIFTI_TYPE_UINT64:
      return true;
    default:
      return false;
  }
}

template <typename T>
double ValueAt(const void* data, int64_t i) {
  return static_cast<double>(static_cast<const T*>(data)[i]);
}

// Converts the voxels to labels; the first value that is not a label in 0..kMaxMaskValue fails.
template <typename T>
absl::Status Convert(const nifti_image& nim, const std::string& path, bool scaled, std::vector<uint16_t>* out) {
  const T* data = static_cast<const T*>(nim.data);
  const int64_t n = nim.nvox;
  out->resize(n);
  const int64_t nx = nim.dim[1], ny = std::max<int64_t>(1, nim.dim[2]);
  auto bad = [&](int64_t i, double v, const char* why) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "volume '%s': value %.17g at (x=%d, y=%d, z=%d) %s (labels must be integers in 0..%d)", path, v, i % nx,
        (i / nx) % ny, i / (nx * ny), why, kMaxMaskValue));
  };
  for (int64_t i = 0; i < n; ++i) {
    double v = static_cast<double>(data[i]);
    if (scaled) v = static_cast<double>(nim.scl_slope) * v + static_cast<double>(nim.scl_inter);
    if constexpr (std::is_integral_v<T>) {
      if (!scaled) {
        if (data[i] < 0 || static_cast<uint64_t>(data[i]) > static_cast<uint64_t>(kMaxMaskValue)) {
          return bad(i, v, "is out of range");
        }
        (*out)[i] = static_cast<uint16_t>(data[i]);
        continue;
      }
    }
    if (!std::isfinite(v)) return bad(i, v, "is not finite");
    if (!(v == std::floor(v))) return bad(i, v, "is not an integer");
    if (v < 0 || v > kMaxMaskValue) return bad(i, v, "is out of range");
    (*out)[i] = static_cast<uint16_t>(v);
  }
  return absl::OkStatus();
}

// A header's 32-bit word at byte `at`, swapped when the file's byte order is not this machine's.
uint32_t HeaderWord(const unsigned char* h, int at, bool swap) {
  uint32_t v;
  std::memcpy(&v, h + at, 4);
  return swap ? __builtin_bswap32(v) : v;
}

// The header's vox_offset as the file states it (NIfTI-1: a float at byte 108; NIfTI-2: an int64 at
// byte 168), in the file's byte order. nifti_clib casts NIfTI-1's float to int (undefined past 2^31)
// and raises any offset below the header's size to it, so it is read here, as nibabel does.
absl::StatusOr<double> HeaderVoxOffset(gzFile f, const std::string& path) {
  unsigned char h[540];
  const int n = gzread(f, h, sizeof(h));
  if (n < 348) return absl::InvalidArgumentError(absl::StrCat("volume '", path, "': the header is cut short"));
  auto u32 = [&](int at, bool swap) { return HeaderWord(h, at, swap); };
  for (bool swap : {false, true}) {
    if (u32(0, swap) == 348) {
      const uint32_t bits = u32(108, swap);
      float offset;
      std::memcpy(&offset, &bits, 4);
      return static_cast<double>(offset);
    }
    if (u32(0, swap) == 540 && n >= 540) {
      uint64_t v;
      std::memcpy(&v, h + 168, 8);
      if (swap) v = __builtin_bswap64(v);
      return static_cast<double>(static_cast<int64_t>(v));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("volume '", path, "' is not a NIfTI-1/NIfTI-2 file"));
}

// The header's dimension count read before nifti_clib sees the file: its NIfTI-2 reader fixes up
// dim[1..dim[0]] without checking that dim[0] is at most 7, writing past its stack for a crafted
// dim[0] (found by tests/fuzz/nifti_fuzz.cc). NIfTI-1 and NIfTI-2 in either byte order.
absl::Status CheckDimensionCount(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot open volume '", path, "'"));
  unsigned char h[540];
  const int n = gzread(f, h, sizeof(h));
  gzclose(f);
  auto u32 = [&](int at, bool swap) { return HeaderWord(h, at, swap); };
  for (bool swap : {false, true}) {
    int64_t dims = -1;
    if (n >= 348 && u32(0, swap) == 348) {
      uint16_t d;
      std::memcpy(&d, h + 40, 2);
      dims = static_cast<int16_t>(swap ? __builtin_bswap16(d) : d);
    } else if (n >= 540 && u32(0, swap) == 540) {
      uint64_t d;
      std::memcpy(&d, h + 16, 8);
      dims = static_cast<int64_t>(swap ? __builtin_bswap64(d) : d);
    } else {
      continue;
    }
    if (dims < 1 || dims > 7) {
      return absl::InvalidArgumentError(
          absl::StrCat("volume '", path, "' declares ", dims, " dimensions (dim[0]); a NIfTI file has 1 to 7"));
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("volume '", path, "' is not a NIfTI-1/NIfTI-2 file"));
}

// The voxels of `nim` read from `path` (plain or gzip) into nim->data, instead of nifti_clib's
// nifti_image_load: that one replaces NaN and infinite floats by 0 without a word (a prediction of
// NaNs would be scored as empty) and trusts vox_offset. Here the offset must be a whole number at
// or past the header and the extension flag (352 bytes for NIfTI-1, 544 for NIfTI-2), and the file
// must hold every voxel after it; the bytes are swapped to this machine's order.
absl::Status LoadVoxels(nifti_image* nim, const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot open volume '", path, "'"));
  absl::Cleanup closer = [f] { gzclose(f); };
  ASSIGN_OR_RETURN(const double offset, HeaderVoxOffset(f, path));
  const double first = nim->nifti_type == NIFTI_FTYPE_NIFTI2_1 ? 544 : 352;
  if (!std::isfinite(offset) || offset != std::floor(offset) || offset < first || offset > 1e15) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "volume '%s': vox_offset %.17g is not where voxels can start (a whole number of bytes from %.0f on)", path,
        offset, first));
  }
  const int64_t bytes = CheckedProduct({nim->nvox, nim->nbyper});
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("volume '", path, "': its size overflows"));
  if (gzseek(f, static_cast<z_off_t>(offset), SEEK_SET) < 0 || gztell(f) != static_cast<z_off_t>(offset)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "volume '%s': vox_offset %.0f lies past the end of the file", path, offset));
  }
  nim->data = std::malloc(static_cast<size_t>(std::max<int64_t>(bytes, 1)));  // nifti_image_free frees it.
  if (nim->data == nullptr) return absl::ResourceExhaustedError(absl::StrCat("volume '", path, "': out of memory"));
  int64_t got = 0;
  while (got < bytes) {
    const unsigned piece = static_cast<unsigned>(std::min<int64_t>(bytes - got, int64_t{1} << 30));
    const int n = gzread(f, static_cast<char*>(nim->data) + got, piece);
    if (n <= 0) break;
    got += n;
  }
  if (got != bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "volume '%s': the file ends %d bytes into its voxels (vox_offset %.0f, %d bytes of voxels declared): truncated, "
        "or vox_offset is wrong", path, got, offset, bytes));
  }
  if (nim->byteorder != nifti_short_order() && nim->swapsize > 1) nifti_swap_Nbytes(nim->nvox, nim->swapsize, nim->data);
  return absl::OkStatus();
}

// The first NaN or infinite value of a float volume, named with its position; OK for other types.
template <typename T>
absl::Status CheckFinite(const nifti_image& nim, const std::string& path) {
  if constexpr (std::is_floating_point_v<T>) {
    const T* data = static_cast<const T*>(nim.data);
    const int64_t nx = nim.dim[1], ny = std::max<int64_t>(1, nim.dim[2]);
    for (int64_t i = 0; i < nim.nvox; ++i) {
      if (!std::isfinite(data[i])) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "volume '%s': value %g at (x=%d, y=%d, z=%d) is not finite", path, static_cast<double>(data[i]), i % nx,
            (i / nx) % ny, i / (nx * ny)));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckFiniteVoxels(const nifti_image& nim, const std::string& path) {
  if (nim.datatype == NIFTI_TYPE_FLOAT32) return CheckFinite<float>(nim, path);
  if (nim.datatype == NIFTI_TYPE_FLOAT64) return CheckFinite<double>(nim, path);
  return absl::OkStatus();
}

std::string FormatTriple(const std::array<double, 3>& v) { return absl::StrFormat("%g,%g,%g", v[0], v[1], v[2]); }

// Refuses FIFOs, devices and directories before nifti_clib opens the path (it would block), and
// paths outside the data roots.
absl::Status CheckOpenable(const std::string& path) {
  absl::StatusOr<RegularFile> file = OpenRegularFile(path);
  if (IsOutsideDataRoots(file.status())) return OutsideDataRootsError("volume", path);
  if (absl::IsInvalidArgument(file.status())) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is ", file.status().message(), ", not a regular file"));
  }
  if (!file.ok()) {
    return absl::Status(file.status().code(), absl::StrCat("cannot open '", path, "': ", file.status().message()));
  }
  close(file->fd);
  return absl::OkStatus();
}

// The volume's size, spacing (z, y, x) and affine from its header; refuses more than 3
// dimensions, more than `max_voxels` voxels, and types that cannot hold labels.
absl::Status ReadGeometry(const nifti_image* nim, const std::string& path, int64_t max_voxels, VolumeGeometry* out) {
  for (int d = 4; d <= 7; ++d) {
    if (d <= nim->dim[0] && nim->dim[d] > 1) {
      return absl::InvalidArgumentError(absl::StrCat("volume '", path, "' has ", nim->dim[0], " dimensions (dim[", d,
                                                     "] = ", nim->dim[d], "); label volumes have at most 3"));
    }
  }
  VolumeGeometry g;
  g.width = nim->dim[0] >= 1 ? nim->dim[1] : 1;
  g.height = nim->dim[0] >= 2 ? nim->dim[2] : 1;
  g.depth = nim->dim[0] >= 3 ? nim->dim[3] : 1;
  if (g.width < 1 || g.height < 1 || g.depth < 1 || g.width > (1 << 30) || g.height > (1 << 30)) {
    return absl::InvalidArgumentError(absl::StrCat("volume '", path, "' has invalid dimensions ", g.width, "x",
                                                   g.height, "x", g.depth));
  }
  const double voxels = static_cast<double>(g.width) * static_cast<double>(g.height) * static_cast<double>(g.depth);
  if (voxels > static_cast<double>(max_voxels)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "volume '%s' declares %dx%dx%d (x, y, z) = %.0f voxels, more than the limit of %d (--max-image-pixels)",
        path, g.width, g.height, g.depth, voxels, max_voxels));
  }
  const bool integer = IsIntegerType(nim->datatype);
  if (!integer && nim->datatype != NIFTI_TYPE_FLOAT32 && nim->datatype != NIFTI_TYPE_FLOAT64) {
    return absl::InvalidArgumentError(absl::StrCat("volume '", path, "' has data type ",
                                                   nifti_datatype_string(nim->datatype),
                                                   "; label volumes need an integer (or integral float) type"));
  }
  for (int a = 0; a < 3; ++a) {
    const double p = nim->pixdim[3 - a];
    g.spacing[a] = p > 0 && std::isfinite(p) ? p : 1.0;
  }
  const bool unit_pixdim = g.spacing[0] == 1 && g.spacing[1] == 1 && g.spacing[2] == 1;
  const nifti_dmat44* m = nullptr;
  if (nim->sform_code > 0) {
    m = &nim->sto_xyz;
    g.affine_source = "sform";
  } else if (nim->qform_code > 0) {
    m = &nim->qto_xyz;
    g.affine_source = "qform";
  }
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 4; ++c) {
      if (m != nullptr) {
        g.affine[r][c] = m->m[r][c];
      } else {
        g.affine[r][c] = r == c ? g.spacing[2 - r] : 0.0;
      }
    }
  }
  g.spacing_in_header = m != nullptr || !unit_pixdim;
  *out = g;
  return absl::OkStatus();
}

// The loaded voxels as labels (scaled where the header says so); the first non-label fails.
absl::Status ConvertLabels(const nifti_image* nim, const std::string& path, std::vector<uint16_t>* labels) {
  const bool scaled = nim->scl_slope != 0 && std::isfinite(nim->scl_slope) &&
                      (nim->scl_slope != 1 || nim->scl_inter != 0);
  absl::Status s;
  switch (nim->datatype) {
    case NIFTI_TYPE_UINT8: s = Convert<uint8_t>(*nim, path, scaled, labels); break;
    case NIFTI_TYPE_INT8: s = Convert<int8_t>(*nim, path, scaled, labels); break;
    case NIFTI_TYPE_INT16: s = Convert<int16_t>(*nim, path, scaled, labels); break;
    case NIFTI_TYPE_UINT16: s = Convert<uint16_t>(*nim, path, scaled, labels); break;
    case NIFTI_TYPE_INT32: s = Convert<int32_t>(*nim, path, scaled, labels); break;
    case NIFTI_TYPE_UINT32: s = Convert<uint32_t>(*nim, path, scaled, labels); break;
    case NIFTI_TYPE_INT64: s = Convert<int64_t>(*nim, path, scaled, labels); break;
    case NIFTI_TYPE_UINT64: s = Convert<uint64_t>(*nim, path, scaled, labels); break;
    case NIFTI_TYPE_FLOAT32: s = Convert<float>(*nim, path, scaled, labels); break;
    default: s = Convert<double>(*nim, path, scaled, labels); break;
  }
  return s;
}

// A NIfTI file's header through nifti_clib (voxels not read), after the checks that keep
// nifti_clib from misreading it: the file opens, and its dimension count is 1 to 7.
absl::StatusOr<NimPtr> ReadNiftiHeader(const std::string& path) {
  QuietNifti();
  RETURN_IF_ERROR(CheckOpenable(path));
  RETURN_IF_ERROR(CheckDimensionCount(path));
  NimPtr nim(nifti_image_read(path.c_str(), 0));
  if (nim == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("volume '", path, "' is not a readable NIfTI-1/NIfTI-2 file"));
  }
  return nim;
}

}  // namespace

bool WithinTolerance(double a, double b, double tolerance) {
  return std::fabs(a - b) <= tolerance * std::max({1.0, std::fabs(a), std::fabs(b)});
}


absl::Status LoadNiftiImage(const std::string& path, int64_t max_voxels, bool keep_raw, VolumeImage* out) {
  ASSIGN_OR_RETURN(NimPtr nim, ReadNiftiHeader(path));
  RETURN_IF_ERROR(ReadGeometry(nim.get(), path, max_voxels, &out->geometry));
  RETURN_IF_ERROR(LoadVoxels(nim.get(), path));
  RETURN_IF_ERROR(CheckFiniteVoxels(*nim, path));  // A model must not get NaN for a voxel.
  const bool scaled = nim->scl_slope != 0 && std::isfinite(nim->scl_slope) &&
                      (nim->scl_slope != 1 || nim->scl_inter != 0);
  const int64_t n = nim->nvox;
  out->values.resize(static_cast<size_t>(n));
  auto convert = [&](auto tag, const char* name) {
    using T = decltype(tag);
    const T* data = static_cast<const T*>(nim->data);
    for (int64_t i = 0; i < n; ++i) {
      double v = static_cast<double>(data[i]);
      if (scaled) v = static_cast<double>(nim->scl_slope) * v + static_cast<double>(nim->scl_inter);
      out->values[static_cast<size_t>(i)] = static_cast<float>(v);
    }
    out->dtype = name;
    if (keep_raw) {
      const uint8_t* bytes = static_cast<const uint8_t*>(nim->data);
      out->raw.assign(bytes, bytes + static_cast<size_t>(n) * sizeof(T));
    }
  };
  switch (nim->datatype) {
    case NIFTI_TYPE_UINT8: convert(uint8_t{}, "uint8"); break;
    case NIFTI_TYPE_INT8: convert(int8_t{}, "int8"); break;
    case NIFTI_TYPE_INT16: convert(int16_t{}, "int16"); break;
    case NIFTI_TYPE_UINT16: convert(uint16_t{}, "uint16"); break;
    case NIFTI_TYPE_INT32: convert(int32_t{}, "int32"); break;
    case NIFTI_TYPE_UINT32: convert(uint32_t{}, "uint32"); break;
    case NIFTI_TYPE_INT64: convert(int64_t{}, "int64"); break;
    case NIFTI_TYPE_UINT64: convert(uint64_t{}, "uint64"); break;
    case NIFTI_TYPE_FLOAT32: convert(float{}, "float32"); break;
    default: convert(double{}, "float64"); break;
  }
  return absl::OkStatus();
}

absl::Status LoadNiftiLabels(const std::string& path, int64_t max_voxels, LabelMap* out, VolumeGeometry* geometry) {
  ASSIGN_OR_RETURN(NimPtr nim, ReadNiftiHeader(path));
  VolumeGeometry g;
  RETURN_IF_ERROR(ReadGeometry(nim.get(), path, max_voxels, &g));
  RETURN_IF_ERROR(LoadVoxels(nim.get(), path));
  RETURN_IF_ERROR(ConvertLabels(nim.get(), path, &out->labels));
  out->depth = static_cast<int>(g.depth);
  out->height = static_cast<int>(g.height);
  out->width = static_cast<int>(g.width);
  out->max_label = -1;
  out->ignored = 0;
  *geometry = g;
  return absl::OkStatus();
}

absl::StatusOr<DeclaredSize> ReadDeclaredSize(const std::string& path, int64_t max_voxels) {
  DeclaredSize d;
  if (IsNiftiPath(path)) {
    ASSIGN_OR_RETURN(NimPtr nim, ReadNiftiHeader(path));
    VolumeGeometry g;
    RETURN_IF_ERROR(ReadGeometry(nim.get(), path, max_voxels, &g));
    d.depth = g.depth;
    d.height = g.height;
    d.width = g.width;
    d.stored_bytes_per_voxel = std::max(1, nim->nbyper);
    return d;
  }
  absl::StatusOr<RegularFile> file = OpenRegularFile(path);
  if (IsOutsideDataRoots(file.status())) return OutsideDataRootsError("", path);
  if (!file.ok()) {
    return absl::Status(file.status().code(), absl::StrCat("cannot read '", path, "': ", file.status().message()));
  }
  // A PNG's size is in its first 24 bytes; a JPEG's frame header is usually in its first few KB.
  std::string head(64 << 10, '\0');
  const ssize_t n = pread(file->fd, head.data(), head.size(), 0);
  close(file->fd);
  head.resize(static_cast<size_t>(std::max<ssize_t>(n, 0)));
  int h = 0, w = 0;
  RETURN_IF_ERROR(ImageDimensions(head, path, &h, &w));
  d.height = h;
  d.width = w;
  d.file_bytes = file->size;
  if (!ProductWithin({d.height, d.width}, max_voxels)) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' declares ", h, "x", w, " pixels, more than the limit of ",
                                                   max_voxels, " (--max-image-pixels)"));
  }
  return d;
}

absl::Status WriteNiftiLabels(const std::string& path, const VolumeGeometry& g, const uint16_t* labels, int datatype,
                              bool nifti2) {
  QuietNifti();
  const int64_t dims[8] = {3, g.width, g.height, g.depth, 1, 1, 1, 1};
  NimPtr nim(nifti_make_new_nim(dims, datatype, 1));
  if (nim == nullptr) return absl::InternalError(absl::StrCat("cannot make a NIfTI image for '", path, "'"));
  const int64_t n = g.width * g.height * g.depth;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t v = labels[i];
    switch (datatype) {
      case NIFTI_TYPE_UINT8: static_cast<uint8_t*>(nim->data)[i] = static_cast<uint8_t>(v); break;
      case NIFTI_TYPE_INT8: static_cast<int8_t*>(nim->data)[i] = static_cast<int8_t>(v); break;
      case NIFTI_TYPE_INT16: static_cast<int16_t*>(nim->data)[i] = static_cast<int16_t>(v); break;
      case NIFTI_TYPE_UINT16: static_cast<uint16_t*>(nim->data)[i] = v; break;
      case NIFTI_TYPE_INT32: static_cast<int32_t*>(nim->data)[i] = v; break;
      case NIFTI_TYPE_UINT32: static_cast<uint32_t*>(nim->data)[i] = v; break;
      case NIFTI_TYPE_INT64: static_cast<int64_t*>(nim->data)[i] = v; break;
      case NIFTI_TYPE_UINT64: static_cast<uint64_t*>(nim->data)[i] = v; break;
      case NIFTI_TYPE_FLOAT32: static_cast<float*>(nim->data)[i] = v; break;
      default: return absl::InvalidArgumentError(absl::StrCat("cannot write NIfTI data type ", datatype));
    }
  }
  nim->pixdim[1] = nim->dx = g.spacing[2];
  nim->pixdim[2] = nim->dy = g.spacing[1];
  nim->pixdim[3] = nim->dz = g.spacing[0];
  nim->xyz_units = NIFTI_UNITS_MM;
  nim->sform_code = NIFTI_XFORM_SCANNER_ANAT;
  nim->qform_code = 0;
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 4; ++c) nim->sto_xyz.m[r][c] = r < 3 ? g.affine[r][c] : (c == 3 ? 1.0 : 0.0);
  }
  if (g.affine_source == "pixdim") {
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 4; ++c) nim->sto_xyz.m[r][c] = r == c ? g.spacing[2 - r] : 0.0;
    }
  }
  nim->nifti_type = nifti2 ? NIFTI_FTYPE_NIFTI2_1 : NIFTI_FTYPE_NIFTI1_1;
  if (nifti_set_filenames(nim.get(), path.c_str(), 0, 1) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot write NIfTI file '", path, "' (name must end .nii or .nii.gz)"));
  }
  nifti_image_write(nim.get());
  if (nifti_get_filesize(path.c_str()) <= 0) return absl::InternalError(absl::StrCat("writing '", path, "' failed"));
  return absl::OkStatus();
}

absl::Status CheckSameGeometry(const VolumeGeometry& ref, const std::string& ref_name, const VolumeGeometry& pred,
                               const std::string& pred_name, double tolerance) {
  if (ref.width != pred.width || ref.height != pred.height || ref.depth != pred.depth) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "prediction '%s' is %dx%dx%d (x, y, z) but reference '%s' is %dx%dx%d", pred_name, pred.width, pred.height,
        pred.depth, ref_name, ref.width, ref.height, ref.depth));
  }
  for (int a = 0; a < 3; ++a) {
    if (!WithinTolerance(ref.spacing[a], pred.spacing[a], tolerance)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "prediction '%s' has spacing %s (z, y, x) but reference '%s' has %s", pred_name,
          FormatTriple(pred.spacing), ref_name, FormatTriple(ref.spacing)));
    }
  }
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 4; ++c) {
      if (!WithinTolerance(ref.affine[r][c], pred.affine[r][c], tolerance)) {
        auto row = [&](const VolumeGeometry& g) {
          return absl::StrFormat("[%g %g %g %g]", g.affine[r][0], g.affine[r][1], g.affine[r][2], g.affine[r][3]);
        };
        return absl::InvalidArgumentError(absl::StrFormat(
            "prediction '%s' has affine row %d %s (%s) but reference '%s' has %s (%s)", pred_name, r, row(pred),
            pred.affine_source, ref_name, row(ref), ref.affine_source));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tally
