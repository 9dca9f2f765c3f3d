#include "server/follow/follow_store.h"

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tally {
namespace {

constexpr char kPrefix[] = "follow/";

}  // namespace

absl::Status SaveFollow(JobStore* store, const v1::Follow& follow) {
  if (follow.follow_id().empty()) return absl::InvalidArgumentError("a follow without an id");
  return store->PutState(absl::StrCat(kPrefix, follow.follow_id()), follow.SerializeAsString());
}

absl::StatusOr<std::vector<v1::Follow>> LoadFollows(JobStore* store) {
  ASSIGN_OR_RETURN(const auto records, store->ListState(kPrefix));
  std::vector<v1::Follow> out;
  for (const auto& [key, value] : records) {
    v1::Follow f;
    if (!f.ParseFromString(value) || absl::StrCat(kPrefix, f.follow_id()) != key) {
      return absl::DataLossError(absl::StrCat("the database's follow record '", key, "' does not parse"));
    }
    out.push_back(std::move(f));
  }
  return out;
}

absl::Status DeleteFollow(JobStore* store, const std::string& follow_id) {
  return store->DeleteState(absl::StrCat(kPrefix, follow_id));
}

}  // namespace tally
