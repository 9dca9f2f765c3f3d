// The prediction store (docs/prediction-store.md): a folder of model outputs kept by three digests,
// so a row already predicted with the same model, settings and input bytes is scored from it
// instead of running the model again.
//
//   ROOT/v1/<model digest, 16 hex>/<settings digest, 16 hex>/<input digest's first 2 hex>/<input digest>.tps
//
// An entry, little-endian:
//   0   8 bytes  "TALLYPS2"
//   8   u32      header bytes (96)
//   12  u32      bits a label: the fewest of 1, 2, 4, 8, 16 that hold the classes
//   16  u32      height          20  u32  width          24  u32  classes (K)     28  u32  0
//   32  i64      non-finite values the model's output had for this row
//   40  u64      payload bytes (raw DEFLATE, libdeflate)
//   48  16 bytes XXH128 of the uncompressed labels (row-major, one stream of `bits` bits a label, least
//                significant first within a byte; 16 bits: little-endian)
//   64  32 bytes SHA-256 of "tally-store-v1\0" model "\0" settings "\0" input (the hex digests)
//   96  payload
// Entries are written whole (a temporary file in the same folder, then rename), so a reader sees an
// old entry, a new one or none, never part of one; two writers of one entry leave one good entry.
// Every read is checked before anything is allocated (sizes against the row's and the file's) and
// after (key, digest, label range): an entry that does not verify is reported (DATA_LOSS) and the
// row is predicted again, never scored from it.
#ifndef TALLY_COMMON_STORE_PREDICTION_STORE_H_
#define TALLY_COMMON_STORE_PREDICTION_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tally {

// Hex digests: of the model (its bytes), of the settings that can change a prediction's bits, and
// of the input (the image's bytes as read, and for Python models the row's other columns).
struct StoreKey {
  std::string model;
  std::string settings;
  std::string input;
};

struct StoredPrediction {
  int height = 0;
  int width = 0;
  int classes = 0;
  int64_t nonfinite = 0;
  std::vector<uint16_t> labels;  // height x width, each < classes.
};

class PredictionStore {
 public:
  explicit PredictionStore(std::string root) : root_(std::move(root)) {}

  const std::string& root() const { return root_; }
  // The entry's path (whether or not it exists). The digests must be hex.
  std::string EntryPath(const StoreKey& key) const;
  // The row's stored prediction, which must be `height` x `width`. NOT_FOUND: none; DATA_LOSS: an
  // entry that does not verify (the message says why and names the file).
  absl::StatusOr<StoredPrediction> Read(const StoreKey& key, int height, int width) const;
  // Writes the entry whole (temporary file, rename); `bytes`, when given, its size. Errors name the file.
  absl::Status Write(const StoreKey& key, const StoredPrediction& prediction, int64_t* bytes = nullptr) const;

 private:
  std::string root_;
};

// What an entry's header says (tally store ls/stats), without reading its labels.
struct StoreEntryInfo {
  int height = 0;
  int width = 0;
  int classes = 0;
  int label_bits = 0;  // 1, 2, 4, 8 or 16.
  int64_t file_bytes = 0;
  int64_t mtime_ns = 0;  // Its last write or hit (Read touches it): what `tally store gc` drops by.
};
// DATA_LOSS when the file is not an entry (its header).
absl::StatusOr<StoreEntryInfo> ReadStoreEntryHeader(const std::string& path);

// The entry file at `path` for a row of `height` x `width`, its size checked before it is read and its
// bytes verified (PredictionStore::Read without marking it used; `tally store export`).
absl::StatusOr<StoredPrediction> ReadStoreEntry(const std::string& path, const StoreKey& key, int height, int width);

// The entry's bytes and back (no file): what Read and Write use, and what the tests break.
std::string EncodeStoreEntry(const StoreKey& key, const StoredPrediction& prediction);
absl::StatusOr<StoredPrediction> DecodeStoreEntry(const std::string& bytes, const StoreKey& key, int height,
                                                  int width);

}  // namespace tally

#endif  // TALLY_COMMON_STORE_PREDICTION_STORE_H_
