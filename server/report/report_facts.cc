#include "server/report/report_facts.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/build_info.h"
#include "common/job/rpc.h"

namespace tally {
namespace {

std::string Hashed(const std::string& sha256) { return sha256.empty() ? "" : absl::StrCat("sha256 ", sha256); }

// What the job read and ran, by kind: a model or the manifest's predictions; COCO and panoptic
// files with their hashes.
void InputFacts(const ReportData& d, std::vector<ReportFact>* out) {
  const v1::JobSpec& spec = d.record->job.spec();
  const JobConfig& c = d.config;
  if (c.panoptic_job()) {
    out->push_back({"Reference", absl::StrCat("PNGs in ", spec.panoptic_dir(), "; ", Hashed(spec.coco_sha256())),
                    spec.coco_panoptic()});
    out->push_back({"Predictions", absl::StrCat("PNGs in ", spec.panoptic_predictions_dir(), "; ",
                                                Hashed(spec.coco_results_sha256())),
                    spec.panoptic_predictions()});
    return;
  }
  if (!spec.model().empty()) {
    out->push_back({"Model", Hashed(spec.model_sha256()), spec.model()});
  } else if (!c.instance_job()) {
    out->push_back({"Predictions", "the manifest's prediction column, scored as they are (no model)", ""});
  }
  if (!spec.coco().empty()) {
    out->push_back({"Annotations", Hashed(spec.coco_sha256()), spec.coco()});
    if (!spec.coco_results().empty()) out->push_back({"Results", Hashed(spec.coco_results_sha256()), spec.coco_results()});
  }
  if (!spec.manifest().empty()) out->push_back({"Manifest", Hashed(spec.manifest_sha256()), spec.manifest()});
}

std::string Rate(double rows, double seconds) { return absl::StrFormat("%.1f rows/s", seconds > 0 ? rows / seconds : 0.0); }

}  // namespace

int64_t RowsNotEvaluated(const ReportData& d) {
  return std::max<int64_t>(0, d.record->job.images_total() - d.evaluated - d.failed);
}

std::string NotEvaluatedReason(const ReportData& d) {
  const v1::Job& job = d.record->job;
  if (!job.sampled().empty()) return job.sampled();
  switch (job.state()) {
    case v1::JOB_STATE_QUEUED:
    case v1::JOB_STATE_RUNNING: return "the job is still running: a partial report";
    case v1::JOB_STATE_CANCELLED: return "the job was cancelled before them";
    case v1::JOB_STATE_FAILED: return "the job failed before them";
    default: return "their results never came";
  }
}

std::string NoFailuresStatement(const ReportData& d) {
  const int64_t left = RowsNotEvaluated(d);
  if (left == 0 && !d.record->job.spec().incomplete_sources().empty()) {
    return "None of the manifest's rows failed, but part of the data could not be indexed (see Not complete).";
  }
  if (left == 0) return "None: every manifest row was evaluated.";
  return absl::StrCat("None of the ", d.evaluated, " evaluated rows failed; ", left, " of the manifest's ",
                      d.record->job.images_total(), " rows were not evaluated (", NotEvaluatedReason(d), ").");
}

std::string SpacingText(const ReportData& d) {
  const JobConfig& c = d.config;
  if (c.spacing_z > 0) {
    return absl::StrCat(c.spacing_z, ",", c.spacing_y, ",", c.spacing_x, " (z,y,x; --spacing",
                        c.force_spacing ? " with --force-spacing" : "", ")");
  }
  if (d.spacings.empty()) return "";
  std::vector<std::string> parts;
  for (const auto& [s, rows] : d.spacings) {
    if (parts.size() == 5) {
      parts.push_back(absl::StrCat("and ", d.spacings.size() - 5, " more"));
      break;
    }
    parts.push_back(absl::StrCat(s[0], ",", s[1], ",", s[2], " in ", rows, rows == 1 ? " volume" : " volumes"));
  }
  return absl::StrCat("each volume's header (z,y,x): ", absl::StrJoin(parts, "; "));
}

Throughputs JobThroughputs(const ReportData& d) {
  const v1::Job& job = d.record->job;
  Throughputs t;
  const double rows = static_cast<double>(d.evaluated + d.failed);
  t.seconds_since_submission = d.wall_seconds;
  t.since_submission = d.wall_seconds > 0 ? rows / d.wall_seconds : 0;
  t.seconds_since_first_lease = job.started_unix() > 0 ? std::max(0.0, d.end_unix - job.started_unix()) : 0;
  t.since_first_lease = t.seconds_since_first_lease > 0 ? rows / t.seconds_since_first_lease : 0;
  for (const WorkerRecord& w : d.workers) {
    const double seconds = std::max(0.0, w.last_result_unix - w.first_lease_unix);
    t.workers += w.stats.images_per_second() > 0 ? w.stats.images_per_second()
                 : seconds > 0                   ? static_cast<double>(w.images) / seconds
                                                 : 0.0;
  }
  return t;
}

std::vector<ReportFact> JobFacts(const ReportData& d) {
  const v1::Job& job = d.record->job;
  std::vector<ReportFact> out;
  out.push_back({"State", absl::StrCat(JobStateName(job.state()), job.error().empty() ? "" : " — " + job.error()), "",
                 true});
  InputFacts(d, &out);
  std::string rows = absl::StrCat(job.images_total(), " in the manifest: ", d.evaluated, " evaluated, ", d.failed,
                                  " failed");
  const bool short_of_all = RowsNotEvaluated(d) > 0;
  if (short_of_all) absl::StrAppend(&rows, ", ", RowsNotEvaluated(d), " not evaluated (", NotEvaluatedReason(d), ")");
  out.push_back({"Rows", rows, "", short_of_all});
  if (!job.spec().incomplete_sources().empty()) {
    out.push_back({"Not complete",
                   absl::StrCat("part of the data could not be indexed, so not every sample is a row: ",
                                job.spec().incomplete_sources(0),
                                job.spec().incomplete_sources_size() > 1
                                    ? absl::StrCat(" (and ", job.spec().incomplete_sources_size() - 1, " more)")
                                    : ""),
                   "", true});
  }
  if (!d.until_ci_note.empty()) out.push_back({"Until CI", d.until_ci_note, "", false});
  if (const std::string spacing = SpacingText(d); !spacing.empty()) out.push_back({"Spacing", spacing, "", false});
  const Throughputs t = JobThroughputs(d);
  out.push_back({"Throughput",
                 absl::StrCat(Rate(d.evaluated + d.failed, t.seconds_since_submission), " from submission to the last ",
                              "result (", absl::StrFormat("%.2f", t.seconds_since_submission),
                              " s, start-up included); ", Rate(d.evaluated + d.failed, t.seconds_since_first_lease),
                              " from the first row leased (", absl::StrFormat("%.2f", t.seconds_since_first_lease),
                              " s, as `tally status` shows); ", absl::StrFormat("%.1f", t.workers),
                              " rows/s summed over the workers' own rates while evaluating"),
                 "", false});
  out.push_back({"Provenance", absl::StrCat("Tally ", kTallyVersion, " (git ", kGitRevision, ")"), "", false});
  return out;
}

}  // namespace tally
