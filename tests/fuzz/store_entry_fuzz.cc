// Prediction store entries (common/store/prediction_store.cc): a file in a folder users and other
// hosts write to, read before a row is scored from it. The first byte picks the row's height and
// width; its depth is the entry's own when that is 2..4 (volumes), else 1; the rest is the entry. A
// decoded entry holds the row's pixels, each label below its classes, scores for every pixel or
// none, and encodes back to an entry that decodes the same.
#include "common/store/prediction_store.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int height = 1 + (data[0] & 0x0F);
  const int width = 1 + (data[0] >> 4);
  const int depth = size > 29 && data[29] >= 2 && data[29] <= 4 ? data[29] : 1;  // The entry's byte 28.
  const tally::StoreKey key{std::string(64, 'a'), std::string(64, 'b'), std::string(32, 'c')};
  absl::StatusOr<tally::StoredPrediction> p =
      tally::DecodeStoreEntry(FuzzInput(data + 1, size - 1), key, height, width, depth);
  if (!p.ok()) return 0;
  FUZZ_CHECK(p->height == height && p->width == width && p->depth == depth);
  FUZZ_CHECK(p->labels.size() == static_cast<size_t>(height) * width * depth);
  FUZZ_CHECK(p->scores.empty() || p->scores.size() == p->labels.size());
  for (uint16_t v : p->labels) FUZZ_CHECK(v < p->classes);
  absl::StatusOr<tally::StoredPrediction> again =
      tally::DecodeStoreEntry(tally::EncodeStoreEntry(key, *p), key, height, width, depth);
  FUZZ_CHECK(again.ok() && again->labels == p->labels && again->classes == p->classes && again->scores == p->scores);
  return 0;
}
