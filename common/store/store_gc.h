// A prediction store's entries walked and pruned: `tally store stats|ls|gc` and the workers'
// --store-max-bytes bound share this. Least recently used (an entry's modification time: its write
// or its last hit) goes first; ties by path, so two collectors drop the same entries.
#ifndef TALLY_COMMON_STORE_STORE_GC_H_
#define TALLY_COMMON_STORE_STORE_GC_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/store/prediction_store.h"

namespace tally {

struct StoreFile {
  std::string model, settings, path;  // The model and settings folders (16 hex each) and the entry.
  std::string input;                  // The input digest (the entry's name without .tps).
  StoreEntryInfo info;
};

struct StoreWalk {
  std::vector<StoreFile> entries;
  std::vector<std::pair<std::string, int64_t>> temporaries;  // A writer's temporary file and its age (ns).
  std::vector<std::string> errors;                           // Files that are not entries, and why.
  int64_t bytes = 0;                                         // Of the entries.
};
// Every entry under ROOT/v1 (model/settings/xx/input.tps), sorted by path.
StoreWalk WalkStore(const std::string& root);

struct StoreCollection {
  int64_t dropped = 0, freed = 0, left = 0, temporaries = 0;
};
// Drops the least recently used entries until the store holds at most `max_bytes`, and temporary
// files older than an hour (a killed writer's). Entries gone meanwhile are skipped.
StoreCollection CollectStore(StoreWalk walk, int64_t max_bytes);

}  // namespace tally

#endif  // TALLY_COMMON_STORE_STORE_GC_H_
