// DICOM through DCMTK (common/formats/dicom.h). DCMTK rather than GDCM: Debian builds GDCM with
// assertions on, and a one-byte change to a file's meta header aborts the process inside
// gdcm::ReadExplicitDataElement (found by tests/fuzz/dicom_fuzz.cc): a worker must survive any
// file. DCMTK returns an error instead, and decodes JPEG (lossless and baseline), JPEG-LS and RLE
// (not JPEG 2000: its free edition has no such codec; such files fail their row, saying so).
// Single-frame images: the stored values (bits stored, sign-extended where signed), times the
// rescale slope plus the intercept, windowed to 0..255; MONOCHROME1 inverted; RGB as it is.
#include <dcmtk/config/osconfig.h>
#include <dcmtk/dcmdata/dcdict.h>
#include <dcmtk/dcmdata/dcistrmb.h>
#include <dcmtk/dcmdata/dcpixseq.h>
#include <dcmtk/dcmdata/dcpxitem.h>
#include <dcmtk/dcmdata/dcrledrg.h>
#include <dcmtk/dcmdata/dctk.h>
#include <dcmtk/dcmjpeg/djdecode.h>
#include <dcmtk/dcmjpls/djdecode.h>
#include <dcmtk/oflog/oflog.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "common/formats/dicom.h"

#ifndef TALLY_DCMTK_DICT
#define TALLY_DCMTK_DICT ""
#endif

namespace tally {
namespace {

// Once a process: logging off (errors come back as conditions), the decoders registered, and the
// data dictionary (implicit-VR files need it) from where the build found it when DCMTK's own
// default path does not hold one (the GPU box's private prefix).
void InitDcmtk() {
  static std::once_flag once;
  std::call_once(once, [] {
    OFLog::configure(OFLogger::OFF_LOG_LEVEL);
    DcmRLEDecoderRegistration::registerCodecs();
    DJDecoderRegistration::registerCodecs();
    DJLSDecoderRegistration::registerCodecs();
    if (!dcmDataDict.isDictionaryLoaded() && *TALLY_DCMTK_DICT != '\0') {
      dcmDataDict.wrlock().loadDictionary(TALLY_DCMTK_DICT);
      dcmDataDict.wrunlock();
    }
  });
}

// The bytes as a DCMTK stream that can be opened again: elements longer than kMaxLoad are then left
// unread by DcmFileFormat::read (DCMTK would allocate an element's declared length before reading
// it: a header that claims 3 GB is a memory bomb, tests/fuzz/dicom_fuzz.cc found one), and loaded
// only when used, after their lengths are checked against the file (PixelDataFits). As DCMTK's own
// file streams do, the factory a stream hands out opens the bytes at the position it was asked at
// (where the deferred value starts): DcmElement::loadValue reads from the new stream's start.
constexpr Uint32 kMaxLoad = 4096;
class ViewFactory : public DcmInputStreamFactory {
 public:
  ViewFactory(const char* data, size_t size) : data_(data), size_(size) {}
  DcmInputStream* create() const override;
  DcmInputStreamFactory* clone() const override { return new ViewFactory(data_, size_); }
  DcmInputStreamFactoryType ident() const override { return DFT_DcmInputFileStreamFactory; }

 private:
  const char* data_;
  size_t size_;
};
class ViewStream : public DcmInputBufferStream {
 public:
  ViewStream(const char* data, size_t size) : data_(data), size_(size) {
    setBuffer(data, static_cast<offile_off_t>(size));
    setEos();
  }
  DcmInputStreamFactory* newFactory() const override {
    const size_t at = std::min(size_, static_cast<size_t>(std::max<offile_off_t>(0, tell())));
    return new ViewFactory(data_ + at, size_ - at);
  }

 private:
  const char* data_;
  size_t size_;
};
DcmInputStream* ViewFactory::create() const { return new ViewStream(data_, size_); }

struct Parsed {
  DcmFileFormat file;
  DcmDataset* ds = nullptr;
  Uint16 rows = 0, cols = 0, spp = 1, allocated = 0, stored = 0, representation = 0, planar = 0;
  long frames = 1;
  std::string photometric;
};


// The structure DCMTK would build from the bytes, walked without building it: sequences and items
// nested deeper than kMaxDicomDepth, or more than kMaxDicomElements elements, fail the file before
// DCMTK parses it (DCMTK recurses once a level: 10 000 nested sequences overflowed a worker's stack).
// Explicit and implicit VR little endian and explicit big endian are walked; a deflated data set
// is inflated by DCMTK only, and its nesting is not bounded here.
class DicomWalk {
 public:
  DicomWalk(const std::string& bytes, const std::string& name) : b_(bytes), name_(name) {}
  absl::Status Run();

 private:
  uint16_t U16(size_t at) const {
    const auto* p = reinterpret_cast<const unsigned char*>(b_.data() + at);
    return big_ ? static_cast<uint16_t>(p[0] << 8 | p[1]) : static_cast<uint16_t>(p[0] | p[1] << 8);
  }
  uint32_t U32(size_t at) const {
    const auto* p = reinterpret_cast<const unsigned char*>(b_.data() + at);
    return big_ ? (uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3])
                : (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24);
  }
  // Reads one element header at pos_: false at the end or where the bytes stop making sense.
  bool Next(uint16_t* group, uint16_t* element, bool* sequence, uint32_t* length);
  absl::Status TooDeep() const {
    return absl::InvalidArgumentError(absl::StrCat("image '", name_, "' is a DICOM file whose sequences nest more than ",
                                                   kMaxDicomDepth, " deep (a limit Tally sets before parsing it)"));
  }

  const std::string& b_;
  const std::string& name_;
  size_t pos_ = 132;
  bool explicit_ = true, big_ = false;
};

bool DicomWalk::Next(uint16_t* group, uint16_t* element, bool* sequence, uint32_t* length) {
  if (pos_ + 8 > b_.size()) return false;
  const bool meta = U16(pos_) == 0x0002 && !big_;  // The meta group is explicit little endian.
  const bool was_big = big_;
  if (meta) big_ = false;
  *group = U16(pos_);
  *element = U16(pos_ + 2);
  *sequence = false;
  if (*group == 0xFFFE || (!explicit_ && !meta)) {
    *length = U32(pos_ + 4);
    pos_ += 8;
    // Implicit VR: a sequence shows only by its undefined length (or the data dictionary).
    *sequence = *group != 0xFFFE && *length == 0xFFFFFFFFu;
  } else {
    const char vr[3] = {b_[pos_ + 4], b_[pos_ + 5], 0};
    const std::string v(vr);
    const bool long_form = v == "OB" || v == "OD" || v == "OF" || v == "OL" || v == "OV" || v == "OW" || v == "SQ" ||
                           v == "SV" || v == "UC" || v == "UN" || v == "UR" || v == "UT" || v == "UV";
    if (long_form) {
      if (pos_ + 12 > b_.size()) return false;
      *length = U32(pos_ + 8);
      pos_ += 12;
    } else {
      *length = U16(pos_ + 6);
      pos_ += 8;
    }
    *sequence = v == "SQ" || ((v == "UN" || v == "OB") && *length == 0xFFFFFFFFu);
  }
  big_ = meta ? was_big : big_;
  return true;
}

absl::Status DicomWalk::Run() {
  std::vector<size_t> ends;  // Open sequences and items: where each ends (SIZE_MAX: at its delimiter).
  int64_t elements = 0;
  uint16_t group = 0, element = 0;
  bool sequence = false;
  uint32_t length = 0;
  while (true) {
    while (!ends.empty() && ends.back() != SIZE_MAX && pos_ >= ends.back()) ends.pop_back();
    if (!Next(&group, &element, &sequence, &length)) break;
    if (++elements > kMaxDicomElements) {
      return absl::InvalidArgumentError(absl::StrCat("image '", name_, "' is a DICOM file of more than ",
                                                     kMaxDicomElements, " elements (a limit Tally sets before parsing it)"));
    }
    if (group == 0x0002 && element == 0x0010 && length < 256 && pos_ + length <= b_.size()) {
      const std::string syntax(b_.data() + pos_, length);
      const size_t last = syntax.find_last_not_of(std::string("\0 ", 2));
      const std::string uid = last == std::string::npos ? "" : syntax.substr(0, last + 1);
      explicit_ = uid != "1.2.840.10008.1.2";
      big_ = uid == "1.2.840.10008.1.2.2";
      if (uid == "1.2.840.10008.1.2.1.99") return absl::OkStatus();  // Deflated: DCMTK's to inflate.
    }
    if (group == 0xFFFE && (element == 0xE00D || element == 0xE0DD)) {  // An item's or a sequence's end.
      if (!ends.empty()) ends.pop_back();
      continue;
    }
    const bool opens = sequence || (group == 0xFFFE && element == 0xE000) ||
                       (group == 0x7FE0 && element == 0x0010 && length == 0xFFFFFFFFu);
    if (opens) {
      ends.push_back(length == 0xFFFFFFFFu ? SIZE_MAX : pos_ + length);
      if (ends.size() > static_cast<size_t>(kMaxDicomDepth)) return TooDeep();
      continue;
    }
    if (length == 0xFFFFFFFFu || pos_ + length > b_.size()) return absl::OkStatus();  // DCMTK decides.
    pos_ += length;
  }
  return absl::OkStatus();
}

absl::Status Read(const std::string& bytes, const std::string& name, Parsed* p) {
  if (absl::Status s = DicomWalk(bytes, name).Run(); !s.ok()) return s;
  InitDcmtk();
  ViewStream in(bytes.data(), bytes.size());
  p->file.transferInit();
  const OFCondition read = p->file.read(in, EXS_Unknown, EGL_noChange, kMaxLoad);
  p->file.transferEnd();
  p->ds = p->file.getDataset();
  if (read.bad() || p->ds == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("image '", name, "' is not a DICOM file DCMTK can read (", read.text(),
                                                   ")"));
  }
  DcmDataset& ds = *p->ds;
  if (!ds.tagExists(DCM_PixelData)) {
    return absl::InvalidArgumentError(absl::StrCat("image '", name, "' is a DICOM file without pixel data (7FE0,0010)"));
  }
  OFString photometric, frames;
  if (ds.findAndGetUint16(DCM_Rows, p->rows).bad() || ds.findAndGetUint16(DCM_Columns, p->cols).bad() ||
      p->rows == 0 || p->cols == 0) {
    return absl::InvalidArgumentError(absl::StrCat("image '", name, "' is a DICOM image without a size (Rows, Columns)"));
  }
  ds.findAndGetUint16(DCM_SamplesPerPixel, p->spp);
  ds.findAndGetUint16(DCM_BitsAllocated, p->allocated);
  ds.findAndGetUint16(DCM_BitsStored, p->stored);
  ds.findAndGetUint16(DCM_PixelRepresentation, p->representation);
  ds.findAndGetUint16(DCM_PlanarConfiguration, p->planar);
  if (ds.findAndGetOFString(DCM_PhotometricInterpretation, photometric).good()) p->photometric = photometric.c_str();
  if (ds.findAndGetOFString(DCM_NumberOfFrames, frames).good()) p->frames = std::atol(frames.c_str());
  if (p->frames != 1) {
    return absl::InvalidArgumentError(absl::StrCat("image '", name, "' is a DICOM image of ", p->frames,
                                                   " frames; Tally reads single-frame images"));
  }
  return absl::OkStatus();
}

// Whether the pixel data (native, or every fragment of an encapsulated one) fits in `file_size`.
bool PixelDataFits(DcmDataset& ds, size_t file_size) {
  DcmElement* element = nullptr;
  if (ds.findAndGetElement(DCM_PixelData, element).bad() || element == nullptr) return false;
  if (element->getLengthField() != DCM_UndefinedLength) return element->getLengthField() <= file_size;
  auto* pixel_data = dynamic_cast<DcmPixelData*>(element);
  if (pixel_data == nullptr) return false;
  E_TransferSyntax xfer = EXS_Unknown;
  const DcmRepresentationParameter* parameter = nullptr;
  pixel_data->getOriginalRepresentationKey(xfer, parameter);
  DcmPixelSequence* sequence = nullptr;
  if (pixel_data->getEncapsulatedRepresentation(xfer, parameter, sequence).bad() || sequence == nullptr) return false;
  uint64_t total = 0;
  for (unsigned long i = 0; i < sequence->card(); ++i) {
    DcmPixelItem* item = nullptr;
    if (sequence->getItem(item, i).bad() || item == nullptr) return false;
    total += item->getLengthField();
    if (total > file_size) return false;
  }
  return true;
}

// The window a DICOM image is shown through: --window, else its header's first, else its type's range.
Window DicomWindow(const Parsed& p, double slope, double intercept, const DecodeOptions& options) {
  if (options.window.given()) return options.window;
  Window w;
  Float64 center = 0, width = 0;
  if (p.ds->findAndGetFloat64(DCM_WindowCenter, center).good() && p.ds->findAndGetFloat64(DCM_WindowWidth, width).good() &&
      std::isfinite(center) && std::isfinite(width) && width >= 1) {
    w.center = center;
    w.width = width;
    return w;
  }
  const int bits = std::max(1, std::min<int>(p.stored, 32));
  const bool is_signed = p.representation == 1;
  const double lo = is_signed ? -std::ldexp(1.0, bits - 1) : 0.0;
  const double hi = is_signed ? std::ldexp(1.0, bits - 1) - 1 : std::ldexp(1.0, bits) - 1;
  double a = lo * slope + intercept, b = hi * slope + intercept;
  if (a > b) std::swap(a, b);
  w.width = std::max(1.0, b - a + 1);
  w.center = a + 0.5 + (w.width - 1) / 2;  // So that a -> 0 and b -> 255.
  return w;
}

}  // namespace

namespace {

// The dictionary's tag of `keyword` (false: none).
bool KeywordTag(const std::string& keyword, DcmTagKey* key) {
  InitDcmtk();
  const DcmDataDictionary& dict = dcmDataDict.rdlock();
  const DcmDictEntry* e = dict.findEntry(keyword.c_str());
  if (e != nullptr) *key = e->getKey();
  dcmDataDict.rdunlock();
  return e != nullptr;
}

}  // namespace

bool IsDicomKeyword(const std::string& keyword) {
  DcmTagKey key;
  return !keyword.empty() && KeywordTag(keyword, &key);
}

absl::Status DicomTagValues(const std::string& bytes, const std::string& name, const std::vector<std::string>& keywords,
                            std::vector<std::string>* values) {
  Parsed p;
  RETURN_IF_ERROR(Read(bytes, name, &p));
  values->assign(keywords.size(), "");
  for (size_t i = 0; i < keywords.size(); ++i) {
    DcmTagKey key;
    OFString v;
    if (!KeywordTag(keywords[i], &key) || key == DCM_PixelData) continue;
    if (p.ds->findAndGetOFStringArray(key, v).good()) (*values)[i] = std::string(v.c_str()).substr(0, 256);
  }
  return absl::OkStatus();
}

absl::Status DicomDimensions(const std::string& bytes, const std::string& name, int* height, int* width) {
  Parsed p;
  absl::Status s = Read(bytes, name, &p);
  if (!s.ok()) return s;
  *height = p.rows;
  *width = p.cols;
  return absl::OkStatus();
}

namespace {

// The checks every decode makes, then the native pixel data (compressed syntaxes decoded).
absl::Status PixelData(const std::string& bytes, const std::string& name, int64_t max_pixels, Parsed* p,
                       const Uint8** data) {
  absl::Status s = Read(bytes, name, p);
  if (!s.ok()) return s;
  if (static_cast<int64_t>(p->rows) * p->cols > max_pixels) {
    return absl::InvalidArgumentError(TooManyPixels("image", name, p->rows, p->cols, max_pixels));
  }
  const bool mono = p->photometric == "MONOCHROME1" || p->photometric == "MONOCHROME2";
  const bool rgb = p->photometric == "RGB";
  if (!((mono && p->spp == 1 && (p->allocated == 8 || p->allocated == 16) && p->stored >= 1 && p->stored <= p->allocated) ||
        (rgb && p->spp == 3 && p->allocated == 8))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "image '", name, "' is a DICOM image Tally cannot read: photometric interpretation '", p->photometric.substr(0, 32),
        "', ", p->spp, " samples of ", p->allocated, " bits (Tally reads MONOCHROME1/2 of 8 or 16 bits and 8-bit RGB)"));
  }
  // Every part of the pixel data no longer than the file (they are loaded at their declared size).
  if (!PixelDataFits(*p->ds, bytes.size())) {
    return absl::InvalidArgumentError(absl::StrCat("image '", name, "' is a DICOM image whose pixel data claims more ",
                                                   "bytes than the file holds (truncated or corrupt)"));
  }
  // Compressed pixel data to native (RLE, JPEG, JPEG-LS); others fail here.
  const OFCondition native = p->ds->chooseRepresentation(EXS_LittleEndianExplicit, nullptr);
  DcmElement* element = nullptr;
  const size_t need = static_cast<size_t>(p->rows) * p->cols * p->spp * (p->allocated / 8);
  *data = nullptr;
  if (native.good() && p->ds->findAndGetElement(DCM_PixelData, element).good() && element != nullptr) {
    Uint8* bytes8 = nullptr;
    Uint16* words = nullptr;
    if (element->getUint8Array(bytes8).good()) {
      *data = bytes8;
    } else if (p->allocated == 16 && element->getUint16Array(words).good()) {
      *data = reinterpret_cast<const Uint8*>(words);
    }
  }
  if (*data == nullptr || element->getLength() < need) {
    return absl::InvalidArgumentError(absl::StrCat("image '", name, "' is a DICOM image whose pixel data cannot be ",
                                                   "decoded (", native.bad() ? native.text() : "truncated or corrupt",
                                                   ")"));
  }
  return absl::OkStatus();
}

// A stored value: the sample's `stored` low bits, sign-extended where signed.
inline int64_t StoredValue(const Uint8* data, size_t i, int allocated, int stored, bool is_signed) {
  uint32_t v;
  if (allocated == 8) {
    v = data[i];
  } else {
    uint16_t u;
    std::memcpy(&u, data + 2 * i, 2);
    v = u;
  }
  const uint32_t mask = stored >= 32 ? ~0u : (1u << stored) - 1;
  v &= mask;
  return is_signed && (v >> (stored - 1)) & 1 ? static_cast<int64_t>(v) - (int64_t{1} << stored) : static_cast<int64_t>(v);
}

// The rescale (slope 0 or absent: 1; intercept absent: 0). A value that is not finite, or one that
// takes the stored type's range out of the finite numbers, fails the image naming the tag: its
// window would be NaN and every pixel black.
absl::Status RescaleOf(const Parsed& p, const std::string& name, double* slope, double* intercept) {
  Float64 s = 1, i = 0;
  if (p.ds->findAndGetFloat64(DCM_RescaleSlope, s).good() && !std::isfinite(s)) {
    return absl::InvalidArgumentError(absl::StrCat("image '", name, "': DICOM RescaleSlope (0028,1053) is ", s,
                                                   ", not a finite number"));
  }
  if (p.ds->findAndGetFloat64(DCM_RescaleIntercept, i).good() && !std::isfinite(i)) {
    return absl::InvalidArgumentError(absl::StrCat("image '", name, "': DICOM RescaleIntercept (0028,1052) is ", i,
                                                   ", not a finite number"));
  }
  if (s == 0) s = 1;
  const int bits = std::max(1, std::min<int>(p.stored, 32));
  const double top = std::ldexp(1.0, bits);
  if (!std::isfinite(top * s + i) || !std::isfinite(-top * s + i)) {
    return absl::InvalidArgumentError(absl::StrCat("image '", name, "': DICOM RescaleSlope (0028,1053) ", s,
                                                   " and RescaleIntercept (0028,1052) ", i, " take the ", bits,
                                                   "-bit stored values past the finite numbers"));
  }
  *slope = s;
  *intercept = i;
  return absl::OkStatus();
}

// A window the header gives that is not finite fails the image naming the tag.
absl::Status CheckHeaderWindow(const Parsed& p, const std::string& name) {
  Float64 v = 0;
  for (const auto& [key, tag] : {std::pair<const char*, DcmTagKey>{"WindowCenter (0028,1050)", DCM_WindowCenter},
                                 {"WindowWidth (0028,1051)", DCM_WindowWidth}}) {
    if (p.ds->findAndGetFloat64(tag, v).good() && !std::isfinite(v)) {
      return absl::InvalidArgumentError(absl::StrCat("image '", name, "': DICOM ", key, " is ", v,
                                                     ", not a finite number"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DecodeDicomRaw(const std::string& bytes, const std::string& name, int64_t max_pixels, RawImage* out) {
  Parsed p;
  const Uint8* data = nullptr;
  absl::Status s = PixelData(bytes, name, max_pixels, &p, &data);
  if (!s.ok()) return s;
  const size_t pixels = static_cast<size_t>(p.rows) * p.cols;
  out->height = p.rows;
  out->width = p.cols;
  out->channels = p.spp;
  out->header.clear();
  out->header.emplace_back("photometric", p.photometric);
  out->header.emplace_back("bits_stored", absl::StrCat(p.stored));
  if (p.photometric == "RGB") {
    out->dtype = "uint8";
    out->data.resize(pixels * 3);
    for (size_t i = 0; i < pixels; ++i) {
      for (int k = 0; k < 3; ++k) out->data[3 * i + k] = p.planar == 1 ? data[k * pixels + i] : data[3 * i + k];
    }
    return absl::OkStatus();
  }
  double slope = 1, intercept = 0;
  RETURN_IF_ERROR(RescaleOf(p, name, &slope, &intercept));
  out->header.emplace_back("rescale_slope", absl::StrCat(slope));
  out->header.emplace_back("rescale_intercept", absl::StrCat(intercept));
  Float64 center = 0, width = 0;
  if (p.ds->findAndGetFloat64(DCM_WindowCenter, center).good() && p.ds->findAndGetFloat64(DCM_WindowWidth, width).good()) {
    out->header.emplace_back("window_center", absl::StrCat(center));
    out->header.emplace_back("window_width", absl::StrCat(width));
  }
  const bool is_signed = p.representation == 1;
  const int bytes_per = p.allocated / 8;
  out->dtype = absl::StrCat(is_signed ? "int" : "uint", p.allocated);
  out->data.resize(pixels * bytes_per);
  for (size_t i = 0; i < pixels; ++i) {
    const int64_t v = StoredValue(data, i, p.allocated, p.stored, is_signed);
    if (bytes_per == 1) {
      out->data[i] = static_cast<uint8_t>(static_cast<int8_t>(v));
    } else {
      const uint16_t u = static_cast<uint16_t>(static_cast<int16_t>(v));
      std::memcpy(out->data.data() + 2 * i, &u, 2);
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeDicomImage(const std::string& bytes, const std::string& name, const DecodeOptions& options,
                              int64_t max_pixels, RgbImage* out) {
  Parsed p;
  const Uint8* data = nullptr;
  absl::Status s = PixelData(bytes, name, max_pixels, &p, &data);
  if (!s.ok()) return s;
  const size_t pixels = static_cast<size_t>(p.rows) * p.cols;
  const bool rgb = p.photometric == "RGB";
  out->height = p.rows;
  out->width = p.cols;
  out->pixels.resize(pixels * 3);
  uint8_t* o = out->pixels.data();
  if (rgb) {
    for (size_t i = 0; i < pixels; ++i) {
      for (int k = 0; k < 3; ++k) o[3 * i + k] = p.planar == 1 ? data[k * pixels + i] : data[3 * i + k];
    }
    return absl::OkStatus();
  }
  double slope = 1, intercept = 0;
  RETURN_IF_ERROR(RescaleOf(p, name, &slope, &intercept));
  if (!options.window.given()) RETURN_IF_ERROR(CheckHeaderWindow(p, name));
  const Window window = DicomWindow(p, slope, intercept, options);
  out->windowed = options.window.given();
  const bool is_signed = p.representation == 1, invert = p.photometric == "MONOCHROME1";
  for (size_t i = 0; i < pixels; ++i) {
    const int64_t value = StoredValue(data, i, p.allocated, p.stored, is_signed);
    const uint8_t g = ApplyWindow(static_cast<double>(value) * slope + intercept, window);
    o[3 * i] = o[3 * i + 1] = o[3 * i + 2] = invert ? static_cast<uint8_t>(255 - g) : g;
  }
  return absl::OkStatus();
}

const ImageDecoder& DicomDecoder() {
  static const ImageDecoder decoder{
      ImageFormat::kDicom,
      [](const std::string& bytes, const std::string& name, int, int* height, int* width) {
        return DicomDimensions(bytes, name, height, width);
      },
      DecodeDicomImage, nullptr, "a DICOM image, not a label map",
      [](const std::string& bytes, const std::string& name, int, int64_t max_pixels,
         RawImage* out) -> absl::StatusOr<bool> {
        absl::Status s = DecodeDicomRaw(bytes, name, max_pixels, out);
        if (!s.ok()) return s;
        return true;
      }};
  return decoder;
}

}  // namespace tally
