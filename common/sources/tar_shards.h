// Tar shards in WebDataset's convention (docs/data.md "Where your data can be"): the rows of a job read
// from tar files instead of a manifest, and the reading of one member's bytes by workers.
//
// A sample is a run of adjacent members sharing a key: the member's path up to the first dot of its
// base name ("train/0001.seg.png": key "train/0001", extension "seg.png"). Its image, mask and
// prediction are the members whose extension is in the job's lists; a `json` member's fields
// become the row's columns. tallyd indexes the tars from their headers alone (libarchive): member
// data is skipped (a seek), except JSON members where columns are kept. Each row then names its
// members by a locator (MemberLocator) that carries the shard's path, the member's data offset
// and size: a worker reads it with one pread from the tar (the rows of a lease are one tar's,
// in order: the reads go front to back), or, for a compressed tar, from the tar decompressed once
// into an unlinked scratch file as far as the lease needs.
#ifndef TALLY_COMMON_SOURCES_TAR_SHARDS_H_
#define TALLY_COMMON_SOURCES_TAR_SHARDS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/sources/manifest.h"
#include "common/sources/tar_listing.h"
#include "common/sources/tar_members.h"

namespace tally {

// --shards: each pattern's brace ranges ({000..999}: numbers as wide as the first, or {a,b}
// lists) expanded, then globs (* ? [) matched (sorted; none matching is an error naming the
// pattern); a single pattern naming an existing file that does not end in a tar extension (.tar,
// .tar.gz, .tgz, .tar.zst, .tar.xz, .tar.bz2) is a list: one shard a line, relative to the list's
// folder, blank lines and lines starting with # skipped. At most `max_shards` shards.
absl::StatusOr<std::vector<std::string>> ExpandShardPatterns(const std::vector<std::string>& patterns,
                                                             size_t max_shards);
// Brace expansion alone (exposed for tests).
absl::StatusOr<std::vector<std::string>> ExpandBraces(const std::string& pattern, size_t max_results);

// Which members play which part (extensions compared case-insensitively, without the dot).
struct SampleConventions {
  std::vector<std::string> image = {"jpg", "jpeg", "png", "tif", "tiff", "webp"};
  std::vector<std::string> mask = {"seg.png", "mask.png"};
  std::vector<std::string> prediction = {"pred.png"};
  bool model = true;          // A model job: samples need an image; else a prediction.
  bool keep_columns = false;  // Read JSON members into columns.
  int64_t max_member_bytes = kDefaultMaxMemberBytes;  // A member declaring more fails its sample.
  absl::Time deadline = absl::InfiniteFuture();       // Indexing past it fails (DEADLINE_EXCEEDED).
};

// Rows from one tar's listing: a row per sample, in order. `seen_keys` holds the keys of earlier
// samples (of this and earlier tars) with the shard each was first met in (an index into `shards`):
// a key met again fails its sample, naming that shard. `columns` are the JSON
// fields kept as columns: those of the first listing's JSON members, in the order first met
// (`columns_fixed` is then set); fields met later that are not among them go to `later_keys`.
struct SampleRowsState {
  absl::flat_hash_map<std::string, uint32_t> seen_keys;
  std::vector<std::string> shards;  // The shards met so far, in order.
  std::vector<std::string> columns;
  bool columns_fixed = false;
  std::vector<std::string> later_keys;  // JSON fields that appeared after the columns were fixed.
};
// `identity`: the shard as indexed, carried by the rows' locators.
std::vector<ManifestRow> SampleRows(const TarListing& listing, const std::string& shard,
                                    const SampleConventions& conventions, int64_t first_index,
                                    SampleRowsState* state, const ShardIdentity& identity = {});

// A job's rows from its shards, indexed one tar at a time as NextBatch asks for rows (so that the
// first tars' rows are stored while later ones are read). The columns are the JSON fields of the
// first tar's JSON members.
class ShardIndex : public RowSource {
 public:
  static absl::StatusOr<std::unique_ptr<ShardIndex>> Open(std::vector<std::string> shards, SampleConventions conventions,
                                                          int64_t max_rows);
  absl::Status NextBatch(size_t max_rows, std::vector<ManifestRow>* rows) override;
  const std::string& path() const override { return description_; }
  int64_t rows_read() const override { return next_index_; }

  // After the last batch: the columns, the first row of each tar, which tars are compressed,
  // what was noticed (truncated tars, later JSON fields), and a SHA-256 over every tar's index.
  const std::vector<std::string>& columns() const { return state_.columns; }
  // Why part of the shards could not be indexed (a shard that ends early): each has a failed row,
  // and a job with any is not complete.
  const std::vector<std::string>& Incomplete() const { return ended_early_; }
  const std::vector<int64_t>& tar_starts() const { return tar_starts_; }
  const std::vector<bool>& tar_compressed() const { return tar_compressed_; }
  std::vector<std::string> Warnings() const;
  std::string IndexSha256() const;

 private:
  ShardIndex(std::vector<std::string> shards, SampleConventions conventions, int64_t max_rows);
  absl::Status IndexNext();

  std::vector<std::string> shards_;
  SampleConventions conventions_;
  int64_t max_rows_;
  std::string description_;
  size_t next_shard_ = 0;
  std::vector<ManifestRow> pending_;
  size_t pending_at_ = 0;
  int64_t next_index_ = 0;
  SampleRowsState state_;
  std::vector<int64_t> tar_starts_;
  std::vector<bool> tar_compressed_;
  std::vector<std::string> ended_early_;
  std::string digests_;
};

}  // namespace tally

#endif  // TALLY_COMMON_SOURCES_TAR_SHARDS_H_
