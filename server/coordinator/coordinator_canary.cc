// Coordinator: the canary for wrong GPUs (--canary N, docs/metrics.md "Answers before the end"). Every worker
// of the job evaluates the first N positions of its order as its first lease; the results (their
// per-class counts, hence the label maps) are compared across workers and never committed. A
// worker takes the job's shards only once its canary agrees with another worker's, so a faulty
// one is out before it commits a row: the workers outside a strict majority are named in the
// report's warnings with the rows, and taken out of the job.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "server/coordinator/coordinator.h"

namespace tally {
namespace {

// How long a finished canary waits for another to compare with before its worker goes on unchecked,
// and, while other workers' canaries are still running (a Python model starting, a busy host), at most.
constexpr double kCanaryWaitSeconds = 10;
constexpr double kCanaryMaxWaitSeconds = 120;

// What must agree across workers: a failed row's reason, else every class's counts (identical label
// maps give identical counts; surface distances follow from the label maps).
std::string Fingerprint(const v1::ImageResult& r) {
  if (!r.error().empty()) return "failed: " + r.error();
  std::string f;
  for (const v1::ClassResult& c : r.classes()) absl::StrAppend(&f, c.tp(), ",", c.fp(), ",", c.fn(), ",", c.tn(), ";");
  return f;
}

std::string Joined(const std::map<int64_t, std::string>& rows) {
  std::string out;
  for (const auto& [index, f] : rows) absl::StrAppend(&out, index, ":", f, "|");
  return out;
}

}  // namespace

void Coordinator::WarnJobLocked(JobEntry* job, const std::string& warning, Deferred* deferred) {
  v1::JobSpec* spec = job->record.job.mutable_spec();
  if (std::find(spec->run_warnings().begin(), spec->run_warnings().end(), warning) != spec->run_warnings().end()) return;
  spec->add_run_warnings(warning);
  deferred->spec_updates.emplace_back(job->record.job.job_id(), *spec);
  Log("job ", job->record.job.job_id(), ": warning: ", warning);
}

bool Coordinator::CanaryLetsInLocked(JobEntry* job, const std::string& worker_id, Grant* grant, Deferred* deferred) {
  const int64_t n = std::min(job->record.job.spec().canary_rows(), job->planned);
  if (n <= 0) return true;
  auto it = job->canaries.find(worker_id);
  if (it == job->canaries.end()) {  // Its first lease of the job: the canary.
    JobEntry::Canary& c = job->canaries[worker_id];
    c.lease_id = next_lease_id_++;
    grant->shard_id = kCanaryShard;
    grant->canary = true;
    grant->shard.begin = 0;
    grant->shard.end = n;
    grant->shard.phase = ShardPhase::kLeased;
    grant->shard.lease_id = c.lease_id;
    return false;
  }
  JobEntry::Canary& c = it->second;
  if (c.LetsIn()) return true;
  if (!c.verdict.empty() || c.completed == 0 || Now() - c.completed < kCanaryWaitSeconds) return false;
  bool running = false;  // Another worker's canary still under way: its answer may decide.
  for (const auto& [w, other] : job->canaries) running |= w != worker_id && other.completed == 0;
  if (running && Now() - c.completed < kCanaryMaxWaitSeconds) return false;
  // Waited long enough: nobody to compare with, or no majority either way. It goes on, said.
  std::vector<std::string> others;
  for (const auto& [w, other] : job->canaries) {
    if (w != worker_id && other.completed > 0 && other.verdict != "disagrees") others.push_back(w);
  }
  const auto wit = workers_.find(worker_id);
  const std::string name = absl::StrCat(wit == workers_.end() ? "" : wit->second.info.name(), " (", worker_id, ")");
  if (others.empty()) {
    c.verdict = "alone";
    WarnJobLocked(job,
                  absl::StrCat("canary: worker ", name, " had no other worker's canary to compare with within ",
                               kCanaryWaitSeconds, " s; it went on unchecked"),
                  deferred);
  } else {
    c.verdict = "tied";
    WarnJobLocked(job,
                  absl::StrCat("canary: worker ", name, " disagrees with ", absl::StrJoin(others, ", "),
                               " on the canary rows and no majority decides; it went on"),
                  deferred);
  }
  return true;
}

absl::Status Coordinator::AdmitCanaryLocked(JobEntry* job, const v1::ReportResultsRequest& request, int32_t classes,
                                            Deferred* deferred) {
  auto it = job->canaries.find(request.worker_id());
  if (it == job->canaries.end() || it->second.lease_id != request.lease_id() || it->second.completed > 0) {
    return absl::OkStatus();  // Stale: nothing to compare.
  }
  Shard canary;
  canary.begin = 0;
  canary.end = std::min(job->record.job.spec().canary_rows(), job->planned);
  RETURN_IF_ERROR(CheckResults(*job, canary, request, classes));
  JobEntry::Canary& c = it->second;
  for (const v1::ImageResult& r : request.results()) c.rows[r.index()] = Fingerprint(r);
  if (static_cast<int64_t>(c.rows.size()) >= canary.end) {
    c.completed = Now();
    VoteCanariesLocked(job, deferred);
    NoteWorkLocked();  // Workers waiting for a verdict.
    MaybeCompleteLocked(job);  // Every row may be in already, the job waiting for this vote.
  }
  return absl::OkStatus();
}

bool Coordinator::CanariesUnderWayLocked(JobEntry* job) {
  bool under_way = false;
  for (const auto& [w, c] : job->canaries) under_way |= c.completed == 0 && workers_.count(w) > 0;
  if (!under_way) return false;
  if (job->rows_done_at == 0) job->rows_done_at = Now();
  return Now() - job->rows_done_at < kCanaryWaitSeconds;
}

void Coordinator::VoteCanariesLocked(JobEntry* job, Deferred* deferred) {
  std::map<std::string, std::vector<std::string>> groups;  // The canary's rows -> its workers.
  for (const auto& [w, c] : job->canaries) {
    if (c.completed > 0 && c.verdict != "disagrees") groups[Joined(c.rows)].push_back(w);
  }
  if (groups.empty()) return;
  auto best = groups.begin();
  bool unique = true;
  for (auto g = groups.begin(); g != groups.end(); ++g) {
    if (g->second.size() > best->second.size()) {
      best = g;
      unique = true;
    } else if (g != best && g->second.size() == best->second.size()) {
      unique = false;
    }
  }
  if (!unique || best->second.size() < 2) return;  // No majority (yet): the wait decides.
  const JobEntry::Canary& reference = job->canaries.at(best->second.front());
  for (const std::string& w : best->second) job->canaries[w].verdict = "agrees";
  for (const auto& [key, members] : groups) {
    if (key == best->first) continue;
    for (const std::string& w : members) {
      JobEntry::Canary& c = job->canaries[w];
      c.verdict = "disagrees";
      std::vector<int64_t> differ;
      for (const auto& [index, f] : c.rows) {
        auto r = reference.rows.find(index);
        if (r == reference.rows.end() || r->second != f) differ.push_back(index);
      }
      if (differ.size() > 20) differ.resize(20);
      auto wit = workers_.find(w);
      WarnJobLocked(job,
                    absl::StrCat("canary: worker ", wit == workers_.end() ? "" : wit->second.info.name(), " (", w,
                                 ") disagrees with ", best->second.size(), " other workers on ", c.rows.size(),
                                 " canary rows (first rows that differ, by manifest index: ", absl::StrJoin(differ, ", "),
                                 "): taken out of the job"),
                    deferred);
      job->excluded_workers.insert(w);
      if (wit != workers_.end()) {
        ReleaseWorkerLeasesLocked(&wit->second, w, job->record.job.job_id(), "its canary disagreed", false, deferred);
      }
    }
  }
}

}  // namespace tally
