// Tar shards (common/sources/tar_shards.cc): the header index libarchive gives of arbitrary bytes (tar,
// or tar inside gzip and the other filters), then the samples made of it, JSON columns included.
#include "common/sources/tar_shards.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool json = data[0] & 1;
  tally::SampleConventions conventions;
  conventions.model = (data[0] & 2) == 0;
  conventions.keep_columns = json;
  const std::string bytes = FuzzInput(data + 1, size - 1);
  absl::StatusOr<tally::TarListing> listing = tally::ListTarBytes(bytes, "fuzz.tar", tally::TarListOptions{json});
  if (!listing.ok()) return 0;
  for (const tally::TarMember& m : listing->members) {
    if (m.problem.empty() && m.regular && !listing->compressed) {
      FUZZ_CHECK(m.offset >= 0 && m.offset + m.size <= static_cast<int64_t>(bytes.size()));
    }
  }
  tally::SampleRowsState state;
  std::vector<tally::ManifestRow> rows = tally::SampleRows(*listing, "fuzz.tar", conventions, 0, &state);
  for (const tally::ManifestRow& r : rows) {
    FUZZ_CHECK(r.columns.size() == (json ? state.columns.size() : 0));
    if (r.error.empty() && !r.image_path.empty()) {
      absl::StatusOr<tally::MemberRef> ref = tally::ParseMemberLocator(r.image_path);
      FUZZ_CHECK(ref.ok() && ref->shard == "fuzz.tar");
    }
  }
  return 0;
}
