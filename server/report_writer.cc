#include "server/report_writer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file_util.h"
#include "server/json_writer.h"
#include "server/number_format.h"
#include "common/job_config.h"
#include "common/metrics.h"
#include "common/rpc.h"
#include "common/status_macros.h"
#include "server/aggregator.h"

namespace tally {
namespace {

constexpr const char* kVersion = "0.1.0";

absl::Status WriteFileAtomically(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write '", tmp, "'"));
    out << content;
    out.flush();
    if (!out) return absl::DataLossError(absl::StrCat("error writing '", tmp, "'"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::DataLossError(absl::StrCat("cannot rename '", tmp, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

std::string Html(const std::string& s) {
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

// Short human formatting for tables: 4 decimals, nan/inf spelled out.
std::string Fmt(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return absl::StrFormat("%.4f", v);
}

struct Failure {
  int64_t index;
  std::string id;
  std::string image;
  std::string reason;
};

struct ReportData {
  const JobRecord* record = nullptr;
  JobConfig config;
  std::vector<Metric> metrics;
  Aggregate aggregate;
  std::vector<Failure> failures;
  std::vector<WorkerRecord> workers;
  int64_t evaluated = 0;
  int64_t failed = 0;
  int64_t nonfinite_images = 0;  // Evaluated images whose model output had NaN/Inf (--nonfinite warn).
  int64_t nonfinite_values = 0;
  int num_classes = 0;
  bool include_background = false;
  double wall_seconds = 0;
  // image path of each index appearing in a worst list
  std::vector<std::pair<int64_t, std::string>> worst_images;
};

std::string WorstImage(const ReportData& d, int64_t index) {
  for (const auto& [i, image] : d.worst_images) {
    if (i == index) return image;
  }
  return "";
}

bool IsForeground(const ReportData& d, int c) { return c != 0 || d.include_background; }

std::string BuildJson(const ReportData& d) {
  const v1::Job& job = d.record->job;
  const v1::JobSpec& spec = job.spec();
  JsonWriter w;
  w.BeginObject();
  w.Field("tally_version", kVersion);
  w.Field("job_id", job.job_id());
  w.Field("name", spec.name());
  w.Field("state", JobStateName(job.state()));
  const int64_t missing = job.images_total() - d.evaluated - d.failed;
  w.Field("complete", job.state() == v1::JOB_STATE_SUCCEEDED && missing == 0);
  w.Field("error", job.error());
  w.Field("model", spec.model());
  w.Field("manifest", spec.manifest());
  w.Field("num_classes", d.num_classes);
  w.Key("metrics").BeginArray();
  for (Metric m : d.metrics) w.String(MetricName(m));
  w.EndArray();
  w.Field("include_background", d.include_background);
  w.Key("spacing").BeginArray().Number(d.config.spacing_y).Number(d.config.spacing_x).EndArray();
  w.Field("nsd_tolerance", d.config.nsd_tolerance);
  w.Field("precision", PrecisionName(d.config.precision));
  w.Field("shard_size", d.record->shard_size);
  w.Field("max_image_pixels", d.config.max_image_pixels);
  w.Field("batch_timeout_seconds", d.config.batch_timeout_seconds);
  w.Field("nonfinite", NonfiniteName(d.config.nonfinite));
  if (spec.input_height() > 0) {
    w.Key("input_size").BeginArray().Int(spec.input_height()).Int(spec.input_width()).EndArray();
  } else {
    w.Key("input_size").Null();
  }
  w.Field("images_total", job.images_total());
  w.Field("images_evaluated", d.evaluated);
  w.Field("images_failed", d.failed);
  w.Field("images_missing", missing);
  w.Field("nonfinite_images", d.nonfinite_images);
  w.Field("nonfinite_values", d.nonfinite_values);
  w.Key("failures").BeginArray();
  for (const Failure& f : d.failures) {
    w.BeginObject().Field("index", f.index).Field("id", f.id).Field("image", f.image).Field("reason", f.reason);
    w.EndObject();
  }
  w.EndArray();
  w.Key("classes").BeginArray();
  for (const ClassAggregate& ca : d.aggregate.classes) {
    w.BeginObject();
    w.Field("class", ca.class_id);
    w.Field("foreground", IsForeground(d, ca.class_id));
    w.Field("images", ca.metrics[static_cast<int>(Metric::kDice)].count);
    w.Field("tp", ca.counts.tp).Field("fp", ca.counts.fp).Field("fn", ca.counts.fn).Field("tn", ca.counts.tn);
    for (Metric m : d.metrics) {
      const MetricAggregate& ma = ca.metrics[static_cast<int>(m)];
      const std::string name(MetricName(m));
      w.Field(name + "_mean", ma.mean);
      w.Field(name + "_inf_count", ma.inf_count);
      if (IsCountMetric(m)) {
        w.Field(name + "_global", ma.global);
      } else {
        w.Field(name + "_median", ma.median);
        w.Field(name + "_p95", ma.p95);
      }
      if (m == Metric::kDice) {
        w.Key("dice_mean_ci95").BeginArray().Number(ca.dice_ci_low).Number(ca.dice_ci_high).EndArray();
      }
    }
    w.EndObject();
  }
  w.EndArray();
  for (Metric m : d.metrics) {
    w.Field(absl::StrCat("foreground_", MetricName(m), "_mean"), d.aggregate.foreground_mean[static_cast<int>(m)]);
  }
  w.Key("workers").BeginArray();
  for (const WorkerRecord& wr : d.workers) {
    const double seconds = std::max(0.0, wr.last_result_unix - wr.first_lease_unix);
    w.BeginObject();
    w.Field("id", wr.worker_id).Field("name", wr.name).Field("device", wr.device);
    w.Field("images", wr.images).Field("seconds", seconds);
    w.Field("gpu_name", wr.stats.gpu_name());
    w.Field("peak_memory_bytes", wr.stats.peak_memory_bytes());
    w.Field("batch_size", wr.stats.batch_size());
    w.Field("oom_retries", wr.stats.oom_retries());
    w.Field("images_per_second", wr.stats.images_per_second() > 0
                                     ? wr.stats.images_per_second()
                                     : (seconds > 0 ? static_cast<double>(wr.images) / seconds : 0.0));
    w.Field("first_batch_seconds",
            wr.stats.first_batch_unix() > 0 ? wr.stats.first_batch_unix() - job.created_unix() : 0.0);
    w.Field("model_load_seconds", wr.stats.model_load_seconds());
    w.Field("decode_threads", wr.stats.decode_threads());
    w.Field("logit_ties", wr.stats.logit_ties());
    w.EndObject();
  }
  w.EndArray();
  w.Field("created_unix", job.created_unix());
  w.Field("finished_unix", job.finished_unix());
  w.Field("wall_seconds", d.wall_seconds);
  w.Field("images_per_second",
          d.wall_seconds > 0 ? static_cast<double>(d.evaluated + d.failed) / d.wall_seconds : 0.0);
  w.EndObject();
  return w.str() + "\n";
}

std::string SummaryTable(const ReportData& d) {
  std::string out = "| class |";
  std::string sep = "|---|";
  absl::StrAppend(&out, " images |");
  absl::StrAppend(&sep, "---|");
  for (Metric m : d.metrics) {
    absl::StrAppend(&out, " ", MetricName(m), " mean |");
    absl::StrAppend(&sep, "---|");
    if (IsCountMetric(m) && (m == Metric::kDice || m == Metric::kIou)) {
      absl::StrAppend(&out, " ", MetricName(m), " global |");
      absl::StrAppend(&sep, "---|");
    }
  }
  out += "\n" + sep + "\n";
  for (const ClassAggregate& ca : d.aggregate.classes) {
    absl::StrAppend(&out, "| ", ca.class_id, IsForeground(d, ca.class_id) ? "" : " (background)", " | ",
                    ca.metrics[static_cast<int>(Metric::kDice)].count, " |");
    for (Metric m : d.metrics) {
      const MetricAggregate& ma = ca.metrics[static_cast<int>(m)];
      absl::StrAppend(&out, " ", Fmt(ma.mean));
      if (m == Metric::kDice) absl::StrAppend(&out, " [", Fmt(ca.dice_ci_low), ", ", Fmt(ca.dice_ci_high), "]");
      if (ma.inf_count > 0) absl::StrAppend(&out, " (", ma.inf_count, " inf)");
      absl::StrAppend(&out, " |");
      if (m == Metric::kDice || m == Metric::kIou) absl::StrAppend(&out, " ", Fmt(ma.global), " |");
    }
    out += "\n";
  }
  absl::StrAppend(&out, "| foreground mean | |");
  for (Metric m : d.metrics) {
    absl::StrAppend(&out, " ", Fmt(d.aggregate.foreground_mean[static_cast<int>(m)]), " |");
    if (m == Metric::kDice || m == Metric::kIou) absl::StrAppend(&out, " |");
  }
  return out + "\n";
}

std::string BuildMarkdown(const ReportData& d) {
  const v1::Job& job = d.record->job;
  std::string out = absl::StrCat("# Tally report: ", job.job_id(), "\n\n");
  absl::StrAppend(&out, "- State: **", JobStateName(job.state()), "**", job.error().empty() ? "" : " — " + job.error(),
                  "\n");
  absl::StrAppend(&out, "- Model: `", job.spec().model(), "`\n- Manifest: `", job.spec().manifest(), "`\n");
  absl::StrAppend(&out, "- Images: ", job.images_total(), " in the manifest, ", d.evaluated, " evaluated, ",
                  d.failed, " failed", "\n");
  if (d.nonfinite_images > 0) {
    absl::StrAppend(&out, "- **Warning**: ", d.nonfinite_images, " evaluated images had NaN/Inf in the model output (",
                    d.nonfinite_values, " values; --nonfinite warn)\n");
  }
  absl::StrAppend(&out, "- Classes: ", d.num_classes, "; foreground means over classes ",
                  d.include_background ? "0" : "1", "..", std::max(0, d.num_classes - 1), "\n");
  absl::StrAppend(&out, absl::StrFormat("- Wall time: %.2f s (%.1f images/s)\n\n", d.wall_seconds,
                                        d.wall_seconds > 0 ? (d.evaluated + d.failed) / d.wall_seconds : 0.0));
  out += "## Per class\n\nMeans over images (NaN skipped; inf skipped and counted); Dice mean with its 95% "
         "bootstrap interval; global = from summed counts.\n\n";
  out += SummaryTable(d);
  out += "\n## Worst images by Dice\n";
  for (const ClassAggregate& ca : d.aggregate.classes) {
    if (!IsForeground(d, ca.class_id) || ca.worst.empty()) continue;
    absl::StrAppend(&out, "\n### Class ", ca.class_id, "\n\n| index | image | dice |\n|---|---|---|\n");
    for (const auto& [dice, index] : ca.worst) {
      absl::StrAppend(&out, "| ", index, " | `", WorstImage(d, index), "` | ", Fmt(dice), " |\n");
    }
  }
  absl::StrAppend(&out, "\n## Failures (", d.failures.size(), ")\n\n");
  if (d.failures.empty()) {
    out += "None: every manifest row was evaluated.\n";
  } else {
    out += "| index | image | reason |\n|---|---|---|\n";
    size_t shown = 0;
    for (const Failure& f : d.failures) {
      if (++shown > 100) {
        absl::StrAppend(&out, "\n... and ", d.failures.size() - 100, " more in report.json\n");
        break;
      }
      std::string reason = f.reason;
      std::replace(reason.begin(), reason.end(), '|', '/');
      std::replace(reason.begin(), reason.end(), '\n', ' ');
      absl::StrAppend(&out, "| ", f.index, " | `", f.image, "` | ", reason, " |\n");
    }
  }
  if (!d.workers.empty()) {
    out += "\n## Workers\n\n| worker | device | images | seconds | images/s |\n|---|---|---|---|---|\n";
    for (const WorkerRecord& wr : d.workers) {
      const double seconds = std::max(0.0, wr.last_result_unix - wr.first_lease_unix);
      absl::StrAppend(&out, "| ", wr.name.empty() ? wr.worker_id : wr.name, " | ", wr.device,
                      wr.stats.gpu_name().empty() ? "" : " (" + wr.stats.gpu_name() + ")", " | ", wr.images, " | ",
                      absl::StrFormat("%.2f", seconds), " | ",
                      absl::StrFormat("%.1f", wr.stats.images_per_second() > 0 ? wr.stats.images_per_second()
                                               : seconds > 0 ? wr.images / seconds : 0.0), " |\n");
    }
  }
  return out;
}

// Bar chart of mean Dice per class with its bootstrap interval, as inline SVG.
std::string DiceBarChart(const ReportData& d) {
  const int n = static_cast<int>(d.aggregate.classes.size());
  const int left = 50, top = 20, plot_h = 240, bottom = 40;
  const int bar_w = 40, gap = 24;
  const int width = std::max(320, left + n * (bar_w + gap) + gap);
  const int height = top + plot_h + bottom;
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" role=\"img\" "
      "aria-label=\"mean Dice per class\">",
      width, height);
  for (int t = 0; t <= 10; t += 2) {
    const double y = top + plot_h * (1.0 - t / 10.0);
    absl::StrAppend(&s, absl::StrFormat("<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" class=\"grid\"/>", left, y,
                                        width - 10, y));
    absl::StrAppend(&s, absl::StrFormat("<text x=\"%d\" y=\"%.1f\" class=\"tick\" text-anchor=\"end\">%.1f</text>",
                                        left - 6, y + 4, t / 10.0));
  }
  for (int i = 0; i < n; ++i) {
    const ClassAggregate& ca = d.aggregate.classes[i];
    const double mean = ca.metrics[static_cast<int>(Metric::kDice)].mean;
    const double x = left + gap + i * (bar_w + gap);
    const bool fg = IsForeground(d, ca.class_id);
    if (!std::isnan(mean)) {
      const double h = plot_h * std::clamp(mean, 0.0, 1.0);
      absl::StrAppend(&s, absl::StrFormat("<rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" class=\"%s\">"
                                          "<title>class %d: %.4f</title></rect>",
                                          x, top + plot_h - h, bar_w, h, fg ? "bar" : "bar bg", ca.class_id, mean));
    }
    if (!std::isnan(ca.dice_ci_low)) {
      const double y1 = top + plot_h * (1.0 - std::clamp(ca.dice_ci_low, 0.0, 1.0));
      const double y2 = top + plot_h * (1.0 - std::clamp(ca.dice_ci_high, 0.0, 1.0));
      const double cx = x + bar_w / 2.0;
      absl::StrAppend(&s, absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"ci\"/>", cx,
                                          y1, cx, y2));
      for (double y : {y1, y2}) {
        absl::StrAppend(&s, absl::StrFormat("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" class=\"ci\"/>",
                                            cx - 8, y, cx + 8, y));
      }
    }
    absl::StrAppend(&s, absl::StrFormat("<text x=\"%.1f\" y=\"%d\" class=\"tick\" text-anchor=\"middle\">%d%s</text>",
                                        x + bar_w / 2.0, top + plot_h + 18, ca.class_id, fg ? "" : " (bg)"));
  }
  absl::StrAppend(&s, absl::StrFormat("<text x=\"%d\" y=\"%d\" class=\"axis\" text-anchor=\"middle\">class</text>",
                                      width / 2, height - 4));
  return s + "</svg>";
}

// Histogram of per-image Dice for one class: 20 bins over [0, 1].
std::string DiceHistogram(const ClassAggregate& ca) {
  constexpr int kBins = 20;
  std::array<int64_t, kBins> bins{};
  for (double v : ca.dice_values) bins[std::clamp(static_cast<int>(v * kBins), 0, kBins - 1)]++;
  const int64_t peak = std::max<int64_t>(1, *std::max_element(bins.begin(), bins.end()));
  const int left = 40, top = 10, plot_w = 300, plot_h = 120, bottom = 30;
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" role=\"img\" "
      "aria-label=\"per-image Dice histogram, class %d\">",
      left + plot_w + 24, top + plot_h + bottom, ca.class_id);
  const double bw = static_cast<double>(plot_w) / kBins;
  for (int b = 0; b < kBins; ++b) {
    const double h = plot_h * static_cast<double>(bins[b]) / peak;
    absl::StrAppend(&s, absl::StrFormat("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" class=\"bar\">"
                                        "<title>[%.2f, %.2f): %d</title></rect>",
                                        left + b * bw + 1, top + plot_h - h, bw - 2, h, b / 20.0, (b + 1) / 20.0,
                                        bins[b]));
  }
  absl::StrAppend(&s, absl::StrFormat("<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" class=\"axisline\"/>", left,
                                      top + plot_h, left + plot_w, top + plot_h));
  for (int t = 0; t <= 4; ++t) {
    absl::StrAppend(&s, absl::StrFormat("<text x=\"%.1f\" y=\"%d\" class=\"tick\" text-anchor=\"middle\">%.2f</text>",
                                        left + plot_w * t / 4.0, top + plot_h + 16, t / 4.0));
  }
  absl::StrAppend(&s, absl::StrFormat("<text x=\"%d\" y=\"%d\" class=\"tick\" text-anchor=\"end\">%d</text>", left - 4,
                                      top + 10, peak));
  return s + "</svg>";
}

std::string BuildHtml(const ReportData& d) {
  const v1::Job& job = d.record->job;
  std::string h = R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Tally report )" +
                  Html(job.job_id()) + R"(</title>
<style>
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:24px 32px;color:#1d232b;background:#fff}
h1{font-size:22px;margin:0 0 8px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d8dde3;padding-bottom:4px}
table{border-collapse:collapse;font-size:13px;margin:6px 0} th,td{border:1px solid #d8dde3;padding:4px 8px;text-align:right}
th{background:#f1f4f7} td.l,th.l{text-align:left} .meta{font-size:14px;color:#3c4650;line-height:1.6}
.state-succeeded{color:#137333;font-weight:600}.state-failed,.state-cancelled{color:#b3261e;font-weight:600}
svg .bar{fill:#3b6fd4} svg .bar.bg{fill:#a9b4c2} svg .ci{stroke:#111;stroke-width:1.5} svg .grid{stroke:#e3e7ec}
svg .tick{font-size:11px;fill:#3c4650} svg .axis{font-size:12px;fill:#3c4650} svg .axisline{stroke:#6b7682}
.hists{display:flex;flex-wrap:wrap;gap:18px} .hist h3{font-size:14px;margin:4px 0}
</style></head><body>
)";
  absl::StrAppend(&h, "<h1>Tally report <code>", Html(job.job_id()), "</code></h1>\n<div class=\"meta\">");
  absl::StrAppend(&h, "State: <span class=\"state-", JobStateName(job.state()), "\">", JobStateName(job.state()),
                  "</span>", job.error().empty() ? "" : " — " + Html(job.error()), "<br>");
  absl::StrAppend(&h, "Model: <code>", Html(job.spec().model()), "</code><br>Manifest: <code>",
                  Html(job.spec().manifest()), "</code><br>");
  absl::StrAppend(&h, "Images: ", job.images_total(), " in the manifest, ", d.evaluated, " evaluated, ", d.failed,
                  " failed<br>");
  absl::StrAppend(&h, absl::StrFormat("Wall time: %.2f s (%.1f images/s)", d.wall_seconds,
                                      d.wall_seconds > 0 ? (d.evaluated + d.failed) / d.wall_seconds : 0.0),
                  "</div>\n");
  h += "<h2>Per class</h2>\n<table><tr><th class=\"l\">class</th><th>images</th>";
  for (Metric m : d.metrics) {
    absl::StrAppend(&h, "<th>", MetricName(m), " mean</th>");
    if (m == Metric::kDice) h += "<th>dice 95% CI</th><th>dice global</th>";
    if (m == Metric::kIou) h += "<th>iou global</th>";
  }
  h += "</tr>\n";
  for (const ClassAggregate& ca : d.aggregate.classes) {
    absl::StrAppend(&h, "<tr><td class=\"l\">", ca.class_id, IsForeground(d, ca.class_id) ? "" : " (background)",
                    "</td><td>", ca.metrics[static_cast<int>(Metric::kDice)].count, "</td>");
    for (Metric m : d.metrics) {
      const MetricAggregate& ma = ca.metrics[static_cast<int>(m)];
      absl::StrAppend(&h, "<td>", Fmt(ma.mean), ma.inf_count > 0 ? absl::StrCat(" (", ma.inf_count, " inf)") : "",
                      "</td>");
      if (m == Metric::kDice) {
        absl::StrAppend(&h, "<td>[", Fmt(ca.dice_ci_low), ", ", Fmt(ca.dice_ci_high), "]</td><td>", Fmt(ma.global),
                        "</td>");
      }
      if (m == Metric::kIou) absl::StrAppend(&h, "<td>", Fmt(ma.global), "</td>");
    }
    h += "</tr>\n";
  }
  h += "</table>\n<h2>Mean Dice per class (with 95% bootstrap interval)</h2>\n" + DiceBarChart(d) + "\n";
  h += "<h2>Per-image Dice</h2>\n<div class=\"hists\">\n";
  for (const ClassAggregate& ca : d.aggregate.classes) {
    absl::StrAppend(&h, "<div class=\"hist\"><h3>class ", ca.class_id,
                    IsForeground(d, ca.class_id) ? "" : " (background)", " — ", ca.dice_values.size(),
                    " images</h3>", DiceHistogram(ca), "</div>\n");
  }
  h += "</div>\n<h2>Worst images by Dice</h2>\n";
  for (const ClassAggregate& ca : d.aggregate.classes) {
    if (!IsForeground(d, ca.class_id) || ca.worst.empty()) continue;
    absl::StrAppend(&h, "<h3>class ", ca.class_id, "</h3><table><tr><th>index</th><th class=\"l\">image</th>"
                                                  "<th>dice</th></tr>\n");
    for (const auto& [dice, index] : ca.worst) {
      absl::StrAppend(&h, "<tr><td>", index, "</td><td class=\"l\"><code>", Html(WorstImage(d, index)),
                      "</code></td><td>", Fmt(dice), "</td></tr>\n");
    }
    h += "</table>\n";
  }
  absl::StrAppend(&h, "<h2>Failures (", d.failures.size(), ")</h2>\n");
  if (d.failures.empty()) {
    h += "<p>None: every manifest row was evaluated.</p>\n";
  } else {
    h += "<table><tr><th>index</th><th class=\"l\">image</th><th class=\"l\">reason</th></tr>\n";
    size_t shown = 0;
    for (const Failure& f : d.failures) {
      if (++shown > 200) break;
      absl::StrAppend(&h, "<tr><td>", f.index, "</td><td class=\"l\"><code>", Html(f.image),
                      "</code></td><td class=\"l\">", Html(f.reason), "</td></tr>\n");
    }
    h += "</table>\n";
  }
  h += "</body></html>\n";
  return h;
}

}  // namespace

absl::Status WriteReports(JobStore* store, const JobRecord& record, const std::string& dir) {
  RETURN_IF_ERROR(MakeDirs(dir));
  ReportData d;
  d.record = &record;
  ASSIGN_OR_RETURN(d.config, JobConfigFromSpec(record.job.spec()));
  d.metrics = d.config.metrics;
  d.num_classes = record.job.num_classes();
  d.include_background = d.config.include_background;
  AggregateOptions agg_options;
  agg_options.num_classes = d.num_classes;
  agg_options.metrics = d.metrics;
  agg_options.include_background = d.include_background;
  Aggregator aggregator(agg_options);

  const std::string csv_path = dir + "/per_image.csv";
  const std::string csv_tmp = csv_path + ".tmp";
  std::ofstream csv(csv_tmp, std::ios::binary | std::ios::trunc);
  if (!csv) return absl::PermissionDeniedError(absl::StrCat("cannot write '", csv_tmp, "'"));
  // Under --nonfinite warn, rows with NaN/Inf model output are evaluated: each row says how many.
  const bool nonfinite_column = d.config.nonfinite == NonfinitePolicy::kWarn;
  csv << "index,id,image,class,tp,fp,fn,tn";
  for (Metric m : d.metrics) csv << ',' << MetricName(m);
  if (nonfinite_column) csv << ",nonfinite";
  csv << '\n';
  std::vector<std::pair<int64_t, std::string>> images_by_index;  // For worst-case tables.
  std::string line;
  absl::Status s = store->ForEachResult(
      record.job.job_id(), [&](const v1::ImageResult& r, const std::string& id, const std::string& image) {
        if (!r.error().empty()) {
          d.failures.push_back({r.index(), id, image, r.error()});
          ++d.failed;
          return absl::OkStatus();
        }
        ++d.evaluated;
        if (r.nonfinite() > 0) {
          ++d.nonfinite_images;
          d.nonfinite_values += r.nonfinite();
        }
        aggregator.Add(r);
        images_by_index.emplace_back(r.index(), image);
        const std::string prefix = absl::StrCat(r.index(), ",", CsvField(id), ",", CsvField(image), ",");
        for (int c = 0; c < r.classes_size(); ++c) {
          const v1::ClassResult& cr = r.classes(c);
          line = absl::StrCat(prefix, c, ",", cr.tp(), ",", cr.fp(), ",", cr.fn(), ",", cr.tn());
          for (Metric m : d.metrics) absl::StrAppend(&line, ",", FormatDouble(Aggregator::ImageMetric(r, c, m)));
          if (nonfinite_column) absl::StrAppend(&line, ",", r.nonfinite());
          line.push_back('\n');
          csv << line;
        }
        return absl::OkStatus();
      });
  RETURN_IF_ERROR(s);
  csv.close();
  if (!csv) return absl::DataLossError(absl::StrCat("error writing '", csv_tmp, "'"));
  if (std::rename(csv_tmp.c_str(), csv_path.c_str()) != 0) {
    return absl::DataLossError(absl::StrCat("cannot rename '", csv_tmp, "'"));
  }
  d.aggregate = aggregator.Finish();
  for (const ClassAggregate& ca : d.aggregate.classes) {
    for (const auto& [dice, index] : ca.worst) {
      auto it = std::lower_bound(images_by_index.begin(), images_by_index.end(), std::make_pair(index, std::string()));
      if (it != images_by_index.end() && it->first == index) d.worst_images.emplace_back(index, it->second);
    }
  }
  ASSIGN_OR_RETURN(d.workers, store->ReadWorkers(record.job.job_id()));
  const double end = record.last_result_unix > 0 ? record.last_result_unix : record.job.finished_unix();
  d.wall_seconds = std::max(0.0, end - record.job.created_unix());
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/report.json", BuildJson(d)));
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/summary.md", BuildMarkdown(d)));
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/report.html", BuildHtml(d)));
  return absl::OkStatus();
}

}  // namespace tally
