// The prediction store (docs/prediction-store.md): a folder of model outputs kept by three digests,
// so a row already predicted with the same model, settings and input bytes is scored from it
// instead of running the model again.
//
//   ROOT/v1/<model digest, 16 hex>/<settings digest, 16 hex>/<input digest's first 2 hex>/<input digest>.tps
//
// An entry, little-endian:
//   0   8 bytes  "TALLYPS3"
//   8   u32      header bytes (104)
//   12  u32      bits a label: the fewest of 1, 2, 4, 8, 16 that hold the classes
//   16  u32      height          20  u32  width          24  u32  classes (K)     28  u32  depth (2D: 1)
//   32  i64      non-finite values the model's output had for this row
//   40  u64      payload bytes (raw DEFLATE, libdeflate)
//   48  16 bytes XXH128 of the uncompressed payload: the labels (z, y, x row-major, one stream of
//                `bits` bits a label, least significant first within a byte; 16 bits: little-endian),
//                then, with score bits 16, one little-endian u16 score a pixel
//   64  32 bytes SHA-256 of "tally-store-v1\0" model "\0" settings "\0" input (the hex digests)
//   96  u32      score bits: 0, or 16 where the model gave a single score a pixel (its probability
//                p quantised as round(p * 65535), NaN as 0: QuantizeScore)
//   100 u32      0
//   104 payload
// Entries of the first layout ("TALLYPS2": a 96-byte header ending at the key, 2D, no scores) are
// read too.
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
  int depth = 1;  // Volumes: their slices; 2D rows: 1.
  int height = 0;
  int width = 0;
  int classes = 0;
  int64_t nonfinite = 0;
  std::vector<uint16_t> labels;  // depth x height x width, each < classes.
  // Single-score outputs: each pixel's probability, QuantizeScore'd; empty for other outputs.
  std::vector<uint16_t> scores;
};

// A probability as an entry keeps it: round(p * 65535) of p clamped to [0, 1]; NaN as 0.
uint16_t QuantizeScore(double probability);
// Threshold counts from kept scores, as the runners count them from the model's output: a pixel is
// foreground at t where its score is above t (q / 65535 > t, so exact to 1/65535 in probability);
// tp, fp, fn, tn at each threshold into out[4 * t ...], reference pixels other than 0 and 1 left out.
void CountStoredThresholds(const uint16_t* scores, const uint16_t* reference, size_t pixels,
                           const std::vector<double>& thresholds, int64_t* out);

class PredictionStore {
 public:
  explicit PredictionStore(std::string root) : root_(std::move(root)) {}

  const std::string& root() const { return root_; }
  // The entry's path (whether or not it exists). The digests must be hex.
  std::string EntryPath(const StoreKey& key) const;
  // The row's stored prediction, which must be `height` x `width` (x `depth`, volumes). NOT_FOUND:
  // none; DATA_LOSS: an entry that does not verify (the message says why and names the file).
  absl::StatusOr<StoredPrediction> Read(const StoreKey& key, int height, int width, int depth = 1) const;
  // Writes the entry whole (temporary file, rename); `bytes`, when given, its size. Errors name the file.
  absl::Status Write(const StoreKey& key, const StoredPrediction& prediction, int64_t* bytes = nullptr) const;

 private:
  std::string root_;
};

// What an entry's header says (tally store ls/stats), without reading its labels.
struct StoreEntryInfo {
  int depth = 1;
  int height = 0;
  int width = 0;
  int classes = 0;
  int label_bits = 0;  // 1, 2, 4, 8 or 16.
  int score_bits = 0;  // 16 where the entry keeps scores, else 0.
  int64_t file_bytes = 0;
  int64_t mtime_ns = 0;  // Its last write or hit (Read touches it): what `tally store gc` drops by.
};
// DATA_LOSS when the file is not an entry (its header).
absl::StatusOr<StoreEntryInfo> ReadStoreEntryHeader(const std::string& path);

// The entry file at `path` for a row of `height` x `width`, its size checked before it is read and its
// bytes verified (PredictionStore::Read without marking it used; `tally store export`).
absl::StatusOr<StoredPrediction> ReadStoreEntry(const std::string& path, const StoreKey& key, int height, int width,
                                                int depth = 1);

// The entry's bytes and back (no file): what Read and Write use, and what the tests break.
std::string EncodeStoreEntry(const StoreKey& key, const StoredPrediction& prediction);
absl::StatusOr<StoredPrediction> DecodeStoreEntry(const std::string& bytes, const StoreKey& key, int height,
                                                  int width, int depth = 1);

}  // namespace tally

#endif  // TALLY_COMMON_STORE_PREDICTION_STORE_H_
