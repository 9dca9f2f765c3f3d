// tally follow DIR --manifest ... [job flags] [follow flags] --server HOST:PORT: a follow of a trainer's
// checkpoint folder, kept by tallyd (docs/follow.md); shown as it grows until it ends (or at once
// with --detach). tally follows: the follows tallyd keeps. tally cancel F...: stops one.
#include <chrono>
#include <iostream>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "client/job_flags.h"
#include "common/job/job_config.h"
#include "client/verbs/verb_util.h"
#include "client/verbs/verbs.h"
#include "common/job/rpc.h"

namespace tally {
namespace {

std::string StateName(v1::Follow::State s) {
  switch (s) {
    case v1::Follow::FOLLOW_STATE_FOLLOWING: return "following";
    case v1::Follow::FOLLOW_STATE_FINISHED: return "finished";
    case v1::Follow::FOLLOW_STATE_CANCELLED: return "cancelled";
    default: return "unknown";
  }
}

// One checkpoint's line: its step, decision, metric with interval, rows, race.
std::string Line(const v1::FollowCheckpoint& c) {
  std::string out = absl::StrFormat("step %d  %s  %s", c.step(), c.name(), c.state());
  if (c.metrics_size() > 0) {
    const v1::FollowMetric& m = c.metrics(0);
    absl::StrAppendFormat(&out, "  %s %.4f [%.4f, %.4f]", m.name(), m.mean(), m.lo(), m.hi());
  }
  if (c.rows_total() > 0) absl::StrAppendFormat(&out, "  %d/%d rows", c.rows_evaluated(), c.rows_total());
  if (c.race_rows() > 0) {
    absl::StrAppendFormat(&out, "  race: %d rows, difference [%.4f, %.4f]", c.race_rows(), c.race_lo(), c.race_hi());
  }
  if (!c.reason().empty() && c.state() != "worse") absl::StrAppend(&out, "  (", c.reason(), ")");
  return out;
}

}  // namespace

absl::StatusOr<v1::FollowSpec> FollowSpecFromFlags(const FollowFlags& f, const std::string& folder) {
  v1::FollowSpec spec;
  spec.set_folder(AbsolutePath(folder));
  JobFlags job = f.job;
  if (!job.model.empty() && !ParseModelRef(job.model).python) {
    return absl::InvalidArgumentError("--model: each checkpoint in the folder is the model; a Python model class "
                                      "(--model M.py) may take each checkpoint's path as its `checkpoint` option");
  }
  if (job.model.empty()) job.model = spec.folder() + "/checkpoint.pt";  // Each checkpoint's, set by tallyd.
  ASSIGN_OR_RETURN(*spec.mutable_job(), SpecFromFlags(job, ""));
  spec.set_pattern(f.pattern);
  spec.set_step_regex(f.step_regex);
  if (!(f.settle >= 0)) return absl::InvalidArgumentError("--settle: expected seconds >= 0");
  spec.set_settle_seconds(f.settle);
  spec.set_ready_marker(f.ready_marker);
  spec.set_load_retries(f.load_retries);
  if (f.catch_up != "newest" && f.catch_up != "all") {
    return absl::InvalidArgumentError(absl::StrCat("--catch-up: expected newest or all, got '", f.catch_up, "'"));
  }
  spec.set_catch_up(f.catch_up);
  if (f.race != "on" && f.race != "off") return absl::InvalidArgumentError("--race: expected on or off");
  spec.set_no_race(f.race == "off");
  if (!(f.race_margin >= 0 && f.race_margin < 1)) return absl::InvalidArgumentError("--race-margin: expected [0, 1)");
  spec.set_race_margin(f.race_margin);
  spec.set_metric(f.follow_metric);
  spec.set_until_step(f.until_step);
  spec.set_idle_seconds(f.idle);
  spec.set_on_new_best(f.on_new_best);
  return spec;
}

int WatchFollow(TallyClient& client, const std::string& id, bool json) {
  std::map<std::string, std::string> shown;  // Checkpoint -> its last line.
  while (true) {
    absl::StatusOr<v1::Follow> f = client.GetFollow(id);
    if (!f.ok()) return Finish(f.status());
    for (const v1::FollowCheckpoint& c : f->checkpoints()) {
      if (c.state() == "settling") continue;
      const std::string line = Line(c);
      if (shown[c.name()] == line || (c.state() == "running" && !shown[c.name()].empty())) continue;
      shown[c.name()] = line;
      if (!json) std::cout << line << "\n" << std::flush;
    }
    if (f->state() != v1::Follow::FOLLOW_STATE_FOLLOWING) {
      if (json) {
        std::cout << ToJson(*f) << "\n";
      } else {
        std::cout << "follow " << id << " " << StateName(f->state()) << "; best step " << f->best_step() << "\n";
      }
      return f->state() == v1::Follow::FOLLOW_STATE_FINISHED ? kExitSucceeded : kExitCancelled;
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));
  }
}

int FollowVerb(const FollowFlags& f) {
  if (f.positional.size() != 1) return UsageError("follow", "tally follow takes one folder (the trainer's checkpoints)");
  absl::StatusOr<v1::FollowSpec> spec = FollowSpecFromFlags(f, f.positional[0]);
  if (!spec.ok()) return UsageError("follow", std::string(spec.status().message()));
  absl::StatusOr<std::unique_ptr<TallyClient>> client = Connect(f.connection);
  if (!client.ok()) return Finish(client.status());
  absl::StatusOr<v1::Follow> created = (*client)->CreateFollow(*spec);
  if (!created.ok()) return Finish(created.status());
  std::cout << created->follow_id() << "\n" << std::flush;
  if (f.detach) return kExitSucceeded;
  return WatchFollow(**client, created->follow_id(), f.json);
}

int FollowsVerb(const ConnectionFlags& connection, bool json) {
  absl::StatusOr<std::unique_ptr<TallyClient>> client = Connect(connection);
  if (!client.ok()) return Finish(client.status());
  absl::StatusOr<v1::ListFollowsResponse> list = (*client)->ListFollows();
  if (!list.ok()) return Finish(list.status());
  if (json) {
    std::cout << ToJson(*list) << "\n";
    return kExitSucceeded;
  }
  std::cout << absl::StrFormat("%-24s  %-10s  %11s  %9s  %s\n", "follow", "state", "checkpoints", "best step", "folder");
  for (const v1::Follow& x : list->follows()) {
    std::cout << absl::StrFormat("%-24s  %-10s  %11d  %9d  %s\n", x.follow_id(), StateName(x.state()),
                                 x.checkpoints_size(), x.best_step(), x.spec().folder());
  }
  return kExitSucceeded;
}

int CancelFollowVerb(const ConnectionFlags& connection, const std::string& id) {
  absl::StatusOr<std::unique_ptr<TallyClient>> client = Connect(connection);
  if (!client.ok()) return Finish(client.status());
  absl::StatusOr<v1::Follow> f = (*client)->CancelFollow(id);
  if (!f.ok()) return Finish(f.status());
  std::cout << "follow " << id << " " << StateName(f->state()) << "\n";
  return kExitSucceeded;
}

int DeleteFollowVerb(const ConnectionFlags& connection, const std::string& id) {
  absl::StatusOr<std::unique_ptr<TallyClient>> client = Connect(connection);
  if (!client.ok()) return Finish(client.status());
  if (absl::Status s = (*client)->DeleteFollow(id); !s.ok()) return Finish(s);
  std::cout << "deleted follow " << id << "\n";
  return kExitSucceeded;
}

}  // namespace tally
