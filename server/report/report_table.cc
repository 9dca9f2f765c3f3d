#include "server/report/report_table.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "metrics/bounded_mean.h"
#include "server/report/report_facts.h"

namespace tally {

std::string FormatCell(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return absl::StrFormat("%.4f", v);
}

namespace {
bool HasGlobalColumn(Metric m) { return m == Metric::kDice || m == Metric::kIou || IsLesionMetric(m); }
TableCell Text(std::string s) { return TableCell{std::move(s), false}; }
TableCell Code(std::string s) { return TableCell{std::move(s), true}; }
}  // namespace

namespace {

// Per class: images and the selected metrics, the lesion metrics or all the others (means; Dice with
// its interval; globals of Dice, IoU and lesion metrics; Pr@t), then the foreground means.
Table MetricTable(const ReportData& d, bool lesions) {
  std::vector<Metric> metrics;
  for (Metric m : d.metrics()) {
    if (IsLesionMetric(m) == lesions) metrics.push_back(m);
  }
  Table t;
  t.header = {"class", "images"};
  for (Metric m : metrics) {
    const bool count_only = m == Metric::kLesionTp || m == Metric::kLesionFp || m == Metric::kLesionFn;
    if (!count_only) t.header.push_back(absl::StrCat(MetricName(m), " mean"));
    if (HasGlobalColumn(m)) t.header.push_back(absl::StrCat(MetricName(m), count_only ? "" : " global"));
  }
  // Referring sets' headline numbers (Pr@t: the share of images with IoU >= t).
  if (!lesions) {
    for (double th : d.config.iou_thresholds) t.header.push_back(absl::StrCat("Pr@", th));
  }
  t.left.assign(t.header.size(), false);
  t.left[0] = true;
  for (const ClassAggregate& ca : d.aggregate.classes) {
    if (ca.class_id != 0 && !d.IsCategoryClass(ca.class_id)) continue;  // Instance jobs: ids of no category.
    // Lesion metrics skip the background (docs/metrics.md "Lesion-wise metrics"), unless it is included.
    if (lesions && !d.IsForeground(ca.class_id)) continue;
    const int images_metric = static_cast<int>(lesions ? metrics.front() : Metric::kDice);
    std::vector<TableCell> row = {Text(absl::StrCat(d.ClassName(ca.class_id), d.IsForeground(ca.class_id) ? "" : " (background)")),
                                  Text(absl::StrCat(ca.metrics[images_metric].count))};
    for (Metric m : metrics) {
      const MetricAggregate& ma = ca.metrics[static_cast<int>(m)];
      const bool count_only = m == Metric::kLesionTp || m == Metric::kLesionFp || m == Metric::kLesionFn;
      std::string cell = FormatCell(ma.mean);
      if (m == Metric::kDice && !std::isnan(ca.dice_ci_low)) {
        absl::StrAppend(&cell, " [", FormatCell(ca.dice_ci_low), ", ", FormatCell(ca.dice_ci_high), "]");
      }
      if (ma.inf_count > 0) absl::StrAppend(&cell, " (", ma.inf_count, " inf)");
      if (!count_only) row.push_back(Text(cell));
      if (HasGlobalColumn(m)) {
        row.push_back(Text(count_only ? absl::StrCat(static_cast<int64_t>(ma.global)) : FormatCell(ma.global)));
      }
    }
    if (!lesions) {
      for (double v : ca.iou_ge) row.push_back(Text(FormatCell(v)));
    }
    t.rows.push_back(std::move(row));
  }
  std::vector<TableCell> foreground = {Text("foreground mean"), Text("")};
  for (Metric m : metrics) {
    const bool count_only = m == Metric::kLesionTp || m == Metric::kLesionFp || m == Metric::kLesionFn;
    if (!count_only) foreground.push_back(Text(FormatCell(d.aggregate.foreground_mean[static_cast<int>(m)])));
    if (HasGlobalColumn(m)) foreground.push_back(Text(""));
  }
  if (!lesions) {
    for (size_t i = 0; i < d.config.iou_thresholds.size(); ++i) foreground.push_back(Text(""));
  }
  t.rows.push_back(std::move(foreground));
  return t;
}

}  // namespace

Table ClassTable(const ReportData& d) { return MetricTable(d, false); }

bool HasLesionTable(const ReportData& d) {
  for (Metric m : d.metrics()) {
    if (IsLesionMetric(m)) return true;
  }
  return false;
}

Table LesionTable(const ReportData& d) { return MetricTable(d, true); }

Table ThresholdTable(const ReportData& d) {
  Table t;
  t.header = {"threshold", "dice mean", "dice global", "iou mean", "iou global"};
  t.left.assign(t.header.size(), false);
  for (size_t i = 0; i < d.aggregate.thresholds.size(); ++i) {
    const ThresholdAggregate& ta = d.aggregate.thresholds[i];
    const bool best = static_cast<int>(i) == d.aggregate.best_threshold;
    t.rows.push_back({Text(absl::StrCat(ta.threshold, best ? " (best dice mean)" : "")), Text(FormatCell(ta.dice_mean)),
                      Text(FormatCell(ta.dice_global)), Text(FormatCell(ta.iou_mean)), Text(FormatCell(ta.iou_global))});
  }
  return t;
}

std::string TerminalSummary(const ReportData& d) {
  std::string out;
  if (d.instances.present) {
    absl::StrAppend(&out, MarkdownTable(InstanceStatsTable(d)), "\n", MarkdownTable(InstanceCategoryTable(d)), "\n");
  }
  if (d.panoptic.present) absl::StrAppend(&out, MarkdownTable(PanopticTable(d)), "\n");
  out += MarkdownTable(ClassTable(d));
  if (HasLesionTable(d)) absl::StrAppend(&out, "\n", MarkdownTable(LesionTable(d)));
  if (!d.aggregate.thresholds.empty()) absl::StrAppend(&out, "\n", MarkdownTable(ThresholdTable(d)));
  return out;
}

std::string IntervalSentence(const ReportData& d) {
  switch (d.interval) {
    case IntervalKind::kRows:
      return absl::StrCat("Dice mean with its 95% interval for the images these rows are drawn from (a betting "
                          "interval: it holds its coverage at any number of rows, skewed sets included; none below ",
                          kMinIntervalRows, " rows)");
    case IntervalKind::kSample:
      return absl::StrCat("Dice mean with its 95% interval for the whole manifest's mean, from this uniform random "
                          "sample (a betting interval, finite-population corrected: it holds its coverage at any "
                          "sample size; none below ", kMinIntervalRows, " rows)");
    case IntervalKind::kNone:
      break;
  }
  return "no Dice interval: the rows evaluated so far are the manifest's first ones, not a random sample "
         "(--order random gives one)";
}

Table WorstTable(const ReportData& d, const ClassAggregate& ca) {
  Table t;
  t.header = {"index", "id", "image", "dice"};
  t.left = {false, true, true, false};
  for (const auto& [dice, index] : ca.worst) {
    t.rows.push_back(
        {Text(absl::StrCat(index)), Code(d.WorstId(index)), Code(d.WorstImage(index)), Text(FormatCell(dice))});
  }
  return t;
}

void AddParameter(Table* t, const std::string& name, const std::string& value, bool code = false) {
  t->rows.push_back({TableCell{name, false}, TableCell{value, code}});
}

// Which rows, in which order, and how stored values became pixels: the flags a re-run needs.
void AddRowChoice(const ReportData& d, Table* table) {
  const v1::JobSpec& spec = d.record->job.spec();
  auto add = [table](const std::string& name, const std::string& value) { AddParameter(table, name, value); };
  add("order", spec.random_order() ? absl::StrCat("random, seed ", spec.order_seed(), " (--order random:",
                                                  spec.order_seed(), ")")
                                   : std::string("manifest"));
  if (spec.sample_rows() > 0 || spec.sample_percent() > 0) {
    add("sample", absl::StrCat(spec.sample_rows() > 0 ? absl::StrCat("--sample ", spec.sample_rows())
                                                      : absl::StrCat("--sample ", spec.sample_percent(), "%"),
                               ", drawn with the order's seed ", spec.order_seed()));
  }
  if (spec.until_ci() > 0) {
    add("until ci", absl::StrCat("--until-ci ", spec.until_ci(), " --min-rows ",
                                 spec.min_rows() > 0 ? spec.min_rows() : int64_t{100}));
  }
  if (spec.window_width() > 0) {
    add("window", absl::StrCat(spec.window_center(), ",", spec.window_width(), " (16-bit TIFF and grey DICOM)"));
  }
  add("speculate after", spec.speculate_after() < 0    ? std::string("off")
                         : spec.speculate_after() == 0 ? std::string("auto")
                                                       : absl::StrCat(spec.speculate_after(), " s"));
  if (spec.canary_rows() > 0) add("canary rows", absl::StrCat(spec.canary_rows()));
  add("shard size", d.record->shard_size > 0 ? absl::StrCat(d.record->shard_size) : std::string("as each part's"));
}

std::string ModelOptionsLine(const JobConfig& c) {
  std::vector<std::string> options;
  for (const auto& [k, v] : c.model_options) options.push_back(absl::StrCat(k, "=", v));
  return absl::StrJoin(options, " ");
}

std::string StoreLine(const ReportData& d) {
  return absl::StrCat(d.config.prediction_store, " (", d.from_store, " of ", d.evaluated, " rows from it)");
}

// --compile in one line: what ran and the first worker's trial.
std::string CompileLine(const JobConfig& c) {
  const v1::CompileTrial& t = c.compile_trial;
  if (c.compile_resolved.empty()) return "on (no worker ran a trial)";
  std::string line = absl::StrFormat(
      "%s (trial on a batch of %d: eager %.1f ms, compiled %.1f ms; compiled in %.1f s, %d cached graphs reused; "
      "against eager: max |difference| %.3g, argmax changed on %d of %d pixels)",
      c.compile_resolved == "on" ? "compiled" : "declined, ran eager", t.batch(), t.eager_ms(), t.compiled_ms(),
      t.compile_seconds(), t.cache_hits(), t.max_abs_diff(), t.argmax_changed(), t.pixels());
  if (!t.precompiled().empty()) absl::StrAppend(&line, "; precompiled: ", t.precompiled());
  if (!t.note().empty()) absl::StrAppend(&line, "; ", t.note());
  return line;
}

Table ParameterTable(const ReportData& d) {
  const JobConfig& c = d.config;
  const v1::JobSpec& spec = d.record->job.spec();
  Table t;
  t.header = {"parameter", "value"};
  t.left = {true, true};
  auto add = [&t](const std::string& name, const std::string& value, bool code = false) {
    AddParameter(&t, name, value, code);
  };
  auto list = [](const auto& values) {
    std::vector<std::string> parts;
    for (const auto& v : values) parts.push_back(absl::StrCat(v));
    return parts.empty() ? std::string("none") : absl::StrJoin(parts, ",");
  };
  std::vector<std::string> metrics;
  for (Metric m : c.metrics) metrics.emplace_back(MetricName(m));
  if (c.calibration) metrics.emplace_back(kCalibrationMetric);
  add("metrics", absl::StrJoin(metrics, ","));
  add("classes", absl::StrCat(d.num_classes, c.regions.empty() ? "" : absl::StrCat(" (", c.regions.size(), " regions)")));
  add("include background", c.include_background ? "yes" : "no");
  add("ignore index", c.ignore_index == kNoIgnoreIndex ? "none" : absl::StrCat(c.ignore_index));
  std::vector<std::string> label_map;
  for (const auto& [from, to] : c.label_map) label_map.push_back(absl::StrCat(from, ":", to));
  add("label map", label_map.empty() ? "none" : absl::StrJoin(label_map, ","));
  add("empty score", std::string(EmptyScoreName(c.empty_score)));
  if (!c.thresholds.empty()) add("thresholds", list(c.thresholds));
  if (!c.iou_thresholds.empty()) add("iou thresholds", list(c.iou_thresholds));
  const std::string volume_spacing = SpacingText(d);
  add("spacing", !volume_spacing.empty() ? volume_spacing
                 : c.spacing_z > 0       ? absl::StrCat(c.spacing_z, ",", c.spacing_y, ",", c.spacing_x)
                                         : absl::StrCat(c.spacing_y, ",", c.spacing_x));
  add("nsd tolerance", absl::StrCat(c.nsd_tolerance));
  if (c.volume_job()) {
    add("sliding window", c.sliding_window[0] > 0 ? absl::StrCat(c.sliding_window[0], ",", c.sliding_window[1], ",",
                                                                 c.sliding_window[2], " (z,y,x), overlap ", c.overlap,
                                                                 ", ", c.sw_batch_size, " windows a batch")
                                                  : "none (whole volumes)");
    add("intensity", c.intensity_name);
    if (c.keep_dtype) add("keep dtype", "yes");
  }
  if (!c.predictions()) add("precision", std::string(PrecisionName(c.precision)));
  if (!c.predictions() && !c.volume_job()) {  // What only a 2D image model's run has.
    const std::string ran = c.channels_last_ran() == "on" ? "yes" : "no";
    if (c.channels_last_mode != "auto") {
      add("channels last", ran);
    } else if (c.channels_last_auto) {
      add("channels last", "auto (no worker ran a trial)");
    } else {
      add("channels last", absl::StrCat("auto: ", ran, " (", c.channels_last_trial, ")"));
    }
    if (c.decode_mode != "auto") {
      add("JPEG decoding", c.decode_mode);
    } else if (c.decode_auto) {
      add("JPEG decoding", "auto (no worker ran a trial)");
    } else {
      add("JPEG decoding", absl::StrCat("auto: ", c.decode_ran(), " (", c.decode_trial, ")"));
    }
    add("batch size", c.batch_size > 0 ? absl::StrCat(c.batch_size) : c.batch_size == kBatchAuto ? "auto" : "worker default");
    add("input size", c.input_height > 0 ? absl::StrCat(c.input_height, "x", c.input_width) : "as decoded");
    add("mean / std", absl::StrCat(list(c.mean), " / ", list(c.std)));
  }
  if (!c.predictions()) {
    add("non-finite outputs", std::string(NonfiniteName(c.nonfinite)));
    if (c.python_model()) {
      add("python", c.python.empty() ? "python3" : c.python, true);
      if (!c.model_options.empty()) add("model options", ModelOptionsLine(c));
      if (c.compile) add("compile", CompileLine(c));
    }
  }
  AddRowChoice(d, &t);
  add("max failed fraction", absl::StrCat(c.max_failed_fraction));
  add("thumbnails", absl::StrCat(c.thumbnails));
  if (!c.save_predictions.empty()) add("save predictions", c.save_predictions, true);
  if (!c.prediction_store.empty()) add("prediction store", StoreLine(d), true);
  std::vector<std::string> labels;
  for (const auto& [k, v] : spec.labels()) labels.push_back(absl::StrCat(k, "=", v));
  std::sort(labels.begin(), labels.end());
  if (!labels.empty()) add("labels", absl::StrJoin(labels, " "));
  return t;
}

Table FailureTable(const ReportData& d) {
  Table t;
  t.header = {"index", "image", "reason"};
  t.left = {false, true, true};
  for (size_t i = 0; i < d.failures.size() && i < kMaxFailuresShown; ++i) {
    const Failure& f = d.failures[i];
    t.rows.push_back({Text(absl::StrCat(f.index)), Code(f.image), Text(f.reason)});
  }
  return t;
}

Table WorkerTable(const ReportData& d) {
  Table t;
  t.header = {"worker", "device", "images", "seconds, first lease to last result", "images/s while evaluating"};
  t.left = {true, true, false, false, false};
  for (const WorkerRecord& wr : d.workers) {
    const double seconds = std::max(0.0, wr.last_result_unix - wr.first_lease_unix);
    const double rate = wr.stats.images_per_second() > 0 ? wr.stats.images_per_second()
                        : seconds > 0                    ? wr.images / seconds
                                                         : 0.0;
    t.rows.push_back({Text(wr.name.empty() ? wr.worker_id : wr.name),
                      Text(absl::StrCat(wr.device, wr.stats.gpu_name().empty() ? "" : " (" + wr.stats.gpu_name() + ")")),
                      Text(absl::StrCat(wr.images)), Text(absl::StrFormat("%.2f", seconds)),
                      Text(absl::StrFormat("%.1f", rate))});
  }
  return t;
}

std::string MarkdownTable(const Table& t) {
  auto cell = [](const TableCell& c) {
    std::string s = c.code ? absl::StrCat("`", c.text, "`") : c.text;
    std::replace(s.begin(), s.end(), '|', '/');  // Would end the cell.
    std::replace(s.begin(), s.end(), '\n', ' ');
    return s.empty() ? std::string(" |") : absl::StrCat(" ", s, " |");
  };
  std::string out = "|";
  for (const std::string& h : t.header) out += cell(TableCell{h, false});
  out += "\n|";
  for (size_t i = 0; i < t.header.size(); ++i) out += "---|";
  out += "\n";
  for (const auto& row : t.rows) {
    out += "|";
    for (const TableCell& c : row) out += cell(c);
    out += "\n";
  }
  return out;
}

std::string HtmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

std::string HtmlTable(const Table& t) {
  auto align = [&](size_t col) { return col < t.left.size() && t.left[col] ? " class=\"l\"" : ""; };
  std::string out = "<table><tr>";
  for (size_t i = 0; i < t.header.size(); ++i) absl::StrAppend(&out, "<th", align(i), ">", HtmlEscape(t.header[i]), "</th>");
  out += "</tr>\n";
  for (const auto& row : t.rows) {
    out += "<tr>";
    for (size_t i = 0; i < row.size(); ++i) {
      const std::string text = HtmlEscape(row[i].text);
      absl::StrAppend(&out, "<td", align(i), ">", row[i].code ? absl::StrCat("<code>", text, "</code>") : text, "</td>");
    }
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

}  // namespace tally

namespace tally {

Table InstanceStatsTable(const ReportData& d) {
  Table t;
  t.header = {"metric", "value"};
  t.left = {true, false};
  for (int i = 0; i < 12; ++i) t.rows.push_back({Text(kCocoStatNames[i]), Text(FormatCell(d.instances.stats[i]))});
  return t;
}

Table InstanceCategoryTable(const ReportData& d) {
  Table t;
  t.header = {"category", "name", "AP", "AP50", "AP75", "references", "detections", "TP@0.5", "FP@0.5", "FN@0.5"};
  t.left = {true, true, false, false, false, false, false, false, false, false};
  for (const InstanceCategory& c : d.instances.categories) {
    t.rows.push_back({Text(absl::StrCat(c.id)), Text(c.name), Text(FormatCell(c.ap)), Text(FormatCell(c.ap50)),
                      Text(FormatCell(c.ap75)), Text(absl::StrCat(c.references)), Text(absl::StrCat(c.detections)),
                      Text(absl::StrCat(c.tp50)), Text(absl::StrCat(c.fp50)), Text(absl::StrCat(c.fn50))});
  }
  return t;
}

Table InstanceWorstTable(const ReportData& d) {
  Table t;
  t.header = {"index", "id", "image", "instance F1", "TP@0.5", "FP@0.5", "FN@0.5"};
  t.left = {false, true, true, false, false, false, false};
  for (const InstanceReport::Worst& w : d.instances.worst) {
    t.rows.push_back({Text(absl::StrCat(w.index)), Text(d.WorstId(w.index)), TableCell{d.WorstImage(w.index), true},
                      Text(FormatCell(w.f1)), Text(absl::StrCat(w.tp)), Text(absl::StrCat(w.fp)),
                      Text(absl::StrCat(w.fn))});
  }
  return t;
}

Table PanopticTable(const ReportData& d) {
  Table t;
  t.header = {"", "PQ", "SQ", "RQ", "categories"};
  t.left = {true, false, false, false, false};
  const PanopticSummary& s = d.panoptic.summary;
  for (auto [name, v] : {std::pair<const char*, const PqValues*>{"All", &s.all}, {"Things", &s.things},
                         {"Stuff", &s.stuff}}) {
    t.rows.push_back({Text(name), Text(FormatCell(v->pq)), Text(FormatCell(v->sq)), Text(FormatCell(v->rq)),
                      Text(absl::StrCat(v->n))});
  }
  return t;
}

Table PanopticCategoryTable(const ReportData& d) {
  Table t;
  t.header = {"category", "name", "kind", "PQ", "SQ", "RQ", "TP", "FP", "FN"};
  t.left = {true, true, true, false, false, false, false, false, false};
  const PanopticReport& p = d.panoptic;
  for (size_t i = 0; i < p.summary.per_category.size() && i < p.categories.size(); ++i) {
    const PanopticCategoryResult& c = p.summary.per_category[i];
    t.rows.push_back({Text(absl::StrCat(c.category_id)), Text(p.categories[i].name),
                      Text(p.categories[i].isthing ? "thing" : "stuff"), Text(FormatCell(c.pq)), Text(FormatCell(c.sq)),
                      Text(FormatCell(c.rq)), Text(absl::StrCat(c.tp)), Text(absl::StrCat(c.fp)),
                      Text(absl::StrCat(c.fn))});
  }
  return t;
}

}  // namespace tally
