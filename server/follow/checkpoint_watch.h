// A follow's view of a trainer's checkpoint folder (tally follow DIR): which files are checkpoints,
// which of them are complete, and their copies in the follow's state folder.
//
// A checkpoint is a file of the folder whose name matches --pattern (a shell glob, default *.pt).
// Its step is the first group of --step-regex in its name (ECMAScript, e.g. 'step_(\d+)'), or without
// one the name's last run of digits; -1 where there is none. It is ready to be taken when its size
// and modification time have not changed for --settle seconds, by the watcher's own clock (a
// network filesystem's clock may differ), or at once when the trainer's marker exists
// (--ready-marker '{}.done': "{}" is the checkpoint's name). A checkpoint deleted before it was
// ready is reported gone, once. Taking a checkpoint copies it into the state folder (a copy-on-write
// clone where the filesystem can make one, else the bytes; never a hard link, whose bytes a trainer
// saving over the file in place would change), so the trainer may rotate it away, replace it or
// rewrite it meanwhile; a file that changed between its last look and the end of the copy is not
// taken, and settles again.
//
// Deterministic for a given sequence of folder listings and clock values (Poll's `now`), so the
// follow's manager, which persists what was taken, can be tested with a fake trainer. Not
// thread-safe: one caller.
#ifndef TALLY_SERVER_FOLLOW_CHECKPOINT_WATCH_H_
#define TALLY_SERVER_FOLLOW_CHECKPOINT_WATCH_H_

#include <cstdint>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tally {

struct CheckpointWatchOptions {
  std::string folder;
  std::string pattern = "*.pt";
  std::string step_regex;     // Empty: the name's last run of digits.
  double settle_seconds = 30;
  std::string ready_marker;   // Empty: none.
};

// What Poll saw happen to one checkpoint.
struct CheckpointEvent {
  enum class Kind { kReady, kGone };
  Kind kind = Kind::kReady;
  std::string name;
  int64_t step = -1;
  int64_t size = 0;
  int64_t mtime_ns = 0;
  bool by_marker = false;  // Ready because the trainer's marker exists, not by settling.
};

// A checkpoint copied into the state folder.
struct TakenCheckpoint {
  std::string path;  // In the state folder.
  int64_t size = 0;
  bool cloned = false;  // A copy-on-write clone (FICLONE), not the bytes copied.
};

class CheckpointWatch {
 public:
  // INVALID_ARGUMENT when the step regex does not compile or has no group.
  static absl::StatusOr<CheckpointWatch> Create(CheckpointWatchOptions options);

  // Lists the folder at `now` (seconds, any monotonic origin) and returns what became ready or gone
  // since the last call, ready ones by step (then name). A name is reported ready once; Settle()
  // makes it wait again. Names in `done` (taken, failed or gone before: the manager's record) are
  // not reported again.
  std::vector<CheckpointEvent> Poll(double now, const std::set<std::string>& done = {});

  // Links the ready checkpoint `event` into `state_folder` (created if missing) as
  // <step>-<name>. UNAVAILABLE, and the name settles again from `now`, when the file is gone or
  // changed since it was reported ready; other errors name the file and the cause.
  absl::StatusOr<TakenCheckpoint> Take(const CheckpointEvent& event, const std::string& state_folder, double now);

  // The checkpoint waits another settle from `now` (a load that failed, to be retried).
  void Settle(const std::string& name, double now);

  // Checkpoints seen and not reported ready yet (settling), and the earliest `now` one was first seen.
  int64_t Settling(double* first_seen) const;

  // The step of a checkpoint's file name (as above).
  int64_t StepOf(const std::string& name) const;
  const CheckpointWatchOptions& options() const { return options_; }

 private:
  explicit CheckpointWatch(CheckpointWatchOptions options) : options_(std::move(options)) {}

  struct Seen {
    int64_t size = -1, mtime_ns = -1;
    double unchanged_since = 0;
    double first_seen = 0;
    bool reported = false;  // Ready was reported (and not settled again since).
  };
  bool Marked(const std::string& name) const;

  CheckpointWatchOptions options_;
  bool has_regex_ = false;
  std::regex step_regex_;
  std::map<std::string, Seen> seen_;
};

}  // namespace tally

#endif  // TALLY_SERVER_FOLLOW_CHECKPOINT_WATCH_H_
