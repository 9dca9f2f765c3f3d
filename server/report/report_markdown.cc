#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job/rpc.h"
#include "base/build_info.h"
#include "server/report/report_facts.h"
#include "server/report/report_formats.h"
#include "server/report/report_table.h"

namespace tally {

std::string InstancesMarkdown(const ReportData& d) {
  std::string out = absl::StrCat(
      "## Instances (COCO mask AP)\n\nCOCOeval's segm numbers over ", d.instances.images,
      " evaluated images (IoU 0.50:0.95, maxDets 100; -1 where undefined). Annotations `", d.record->job.spec().coco(),
      "`", d.record->job.spec().coco_results().empty() ? "" : absl::StrCat(", results `", d.record->job.spec().coco_results(), "`"),
      ".\n\n", MarkdownTable(InstanceStatsTable(d)), "\n### Per category\n\n", MarkdownTable(InstanceCategoryTable(d)));
  if (!d.instances.worst.empty()) {
    absl::StrAppend(&out, "\n### Worst images by instance F1 (IoU 0.5)\n\n", MarkdownTable(InstanceWorstTable(d)));
  }
  out += "\nThe semantic metrics below treat each category id as a class: references painted in file order, "
         "detections with score >= 0.5 in ascending score.\n\n";
  return out;
}

std::string ReportMarkdown(const ReportData& d) {
  const v1::Job& job = d.record->job;
  std::string out = absl::StrCat("# Tally report: ", job.job_id(), "\n\n");
  for (const ReportFact& f : JobFacts(d)) {
    std::string text = f.strong ? absl::StrCat("**", f.text, "**") : f.text;
    if (!f.path.empty()) text = f.text.empty() ? absl::StrCat("`", f.path, "`") : absl::StrCat("`", f.path, "` (", text, ")");
    absl::StrAppend(&out, "- ", f.label, ": ", text, "\n");
  }
  if (d.nonfinite_images > 0) {
    absl::StrAppend(&out, "- **Warning**: ", d.nonfinite_images, " evaluated images had NaN/Inf in the model output (",
                    d.nonfinite_values, " values; --nonfinite warn)\n");
  }
  for (const std::string& w : d.warnings) absl::StrAppend(&out, "- **Warning**: ", w, "\n");
  std::vector<std::string> in_mean;
  for (const ClassAggregate& ca : d.aggregate.classes) {
    if (ca.in_foreground_mean) in_mean.push_back(d.ClassName(ca.class_id));
  }
  absl::StrAppend(&out, "- Classes: ", d.num_classes, "; foreground means over ",
                  in_mean.empty() ? "none" : absl::StrJoin(in_mean, ", "),
                  " (foreground classes present in at least one reference mask)\n");
  out += "\n";
  if (d.instances.present) out += InstancesMarkdown(d);
  if (d.panoptic.present) {
    absl::StrAppend(&out, "## Panoptic quality\n\npanopticapi's PQ, SQ and RQ over ", d.panoptic.images,
                    " evaluated images (a segment matches at IoU > 0.5; void and crowd regions as panopticapi).\n\n",
                    MarkdownTable(PanopticTable(d)), "\n### Per category\n\n", MarkdownTable(PanopticCategoryTable(d)),
                    "\nThe semantic metrics below treat each category id as a class (void ignored).\n\n");
  }
  absl::StrAppend(&out, "## Per class\n\nMeans over images (NaN skipped; inf skipped and counted); ",
                  IntervalSentence(d), "; global = from summed counts.\n\n");
  out += MarkdownTable(ClassTable(d));
  if (!d.config.iou_thresholds.empty()) {
    out += "\nPr@t: the share of images whose IoU is at least t (a referring set's precision at t).\n";
  }
  if (HasLesionTable(d)) {
    absl::StrAppend(&out, "\n## Lesions\n\nPer foreground class: lesion-wise means over images and the values pooled "
                          "over every lesion (global); tp, fp, fn are lesion counts.\n\n", MarkdownTable(LesionTable(d)));
  }
  if (!d.aggregate.thresholds.empty()) {
    absl::StrAppend(&out, "\n## Threshold sweep (foreground class)\n\nDice and IoU at each probability threshold; the "
                          "other metrics use the primary threshold 0.5.\n\n", MarkdownTable(ThresholdTable(d)));
  }
  out += GroupsMarkdown(d);
  out += CalibrationMarkdown(d);
  out += "\n## Worst images by Dice\n";
  for (const ClassAggregate& ca : d.aggregate.classes) {
    if (!d.IsForeground(ca.class_id) || ca.worst.empty()) continue;
    const std::string note = ReportData::DiceTieNote(ca);
    absl::StrAppend(&out, "\n### ", d.config.regions.empty() ? "Class " : "Region ", d.ClassName(ca.class_id), "\n\n",
                    note.empty() ? "" : note + ".\n\n", MarkdownTable(WorstTable(d, ca)));
  }
  absl::StrAppend(&out, "\n## Failures (", d.failures.size(), ")\n\n");
  if (!d.failure_groups.empty()) {
    out += "By reason (file names as '…', numbers as #):\n\n";
    for (const FailureGroup& g : d.failure_groups) absl::StrAppend(&out, "- ", g.count, " x ", g.kind, "\n");
    out += "\n";
  }
  if (d.failures.empty()) {
    absl::StrAppend(&out, NoFailuresStatement(d), "\n");
  } else {
    if (RowsNotEvaluated(d) > 0) {
      absl::StrAppend(&out, RowsNotEvaluated(d), " more rows were not evaluated (", NotEvaluatedReason(d), ").\n\n");
    }
    out += MarkdownTable(FailureTable(d));
    if (d.failures.size() > kMaxFailuresShown) {
      absl::StrAppend(&out, "\n... and ", d.failures.size() - kMaxFailuresShown, " more in report.json\n");
    }
  }
  if (!d.workers.empty()) out += "\n## Workers\n\n" + MarkdownTable(WorkerTable(d));
  out += "\n## Parameters\n\n" + MarkdownTable(ParameterTable(d));
  return out;
}

}  // namespace tally
