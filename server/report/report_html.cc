#include <algorithm>
#include <array>
#include <cmath>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job/rpc.h"
#include "base/build_info.h"
#include "common/coco/coco_instances.h"
#include "server/report/report_facts.h"
#include "server/report/report_formats.h"
#include "server/report/report_table.h"

namespace tally {
namespace {

// Bar chart of mean Dice per class with its interval (where there is one), as inline SVG.
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
    const bool fg = d.IsForeground(ca.class_id);
    if (!std::isnan(mean)) {
      const double h = plot_h * std::clamp(mean, 0.0, 1.0);
      absl::StrAppend(&s, absl::StrFormat("<rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" class=\"%s\">"
                                          "<title>class %s: %.4f</title></rect>",
                                          x, top + plot_h - h, bar_w, h, fg ? "bar" : "bar bg", d.ClassName(ca.class_id), mean));
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
    absl::StrAppend(&s, absl::StrFormat("<text x=\"%.1f\" y=\"%d\" class=\"tick\" text-anchor=\"middle\">%s%s</text>",
                                        x + bar_w / 2.0, top + plot_h + 18, d.ClassName(ca.class_id), fg ? "" : " (bg)"));
  }
  absl::StrAppend(&s, absl::StrFormat("<text x=\"%d\" y=\"%d\" class=\"axis\" text-anchor=\"middle\">class</text>",
                                      width / 2, height - 4));
  return s + "</svg>";
}

// Histogram of one metric's per-image values for one class (Histogram: 20 bins over [0, 1], or
// over [0, max] for distances).
std::string MetricHistogram(const Histogram& hist, const std::string& metric, const std::string& name) {
  constexpr int kBins = kHistogramBins;
  const auto& bins = hist.bins;
  const int64_t peak = std::max<int64_t>(1, *std::max_element(bins.begin(), bins.end()));
  const int left = 40, top = 10, plot_w = 240, plot_h = 100, bottom = 30;
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" role=\"img\" "
      "aria-label=\"per-image %s histogram, class %s\">",
      left + plot_w + 24, top + plot_h + bottom, metric, name);
  const double bw = static_cast<double>(plot_w) / kBins;
  const double step = hist.max / kBins;
  for (int b = 0; b < kBins; ++b) {
    const double h = plot_h * static_cast<double>(bins[b]) / peak;
    absl::StrAppend(&s, absl::StrFormat("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" class=\"bar\">"
                                        "<title>[%.3g, %.3g): %d</title></rect>",
                                        left + b * bw + 1, top + plot_h - h, bw - 2, h, b * step, (b + 1) * step,
                                        bins[b]));
  }
  absl::StrAppend(&s, absl::StrFormat("<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" class=\"axisline\"/>", left,
                                      top + plot_h, left + plot_w, top + plot_h));
  for (int t = 0; t <= 4; ++t) {
    absl::StrAppend(&s, absl::StrFormat("<text x=\"%.1f\" y=\"%d\" class=\"tick\" text-anchor=\"middle\">%.3g</text>",
                                        left + plot_w * t / 4.0, top + plot_h + 16, hist.max * t / 4.0));
  }
  absl::StrAppend(&s, absl::StrFormat("<text x=\"%d\" y=\"%d\" class=\"tick\" text-anchor=\"end\">%d</text>", left - 4,
                                      top + 10, peak));
  return s + "</svg>";
}

// The threshold sweep: dice_mean and iou_mean (lines) against the threshold, the best marked.
std::string ThresholdCurve(const ReportData& d) {
  const std::vector<ThresholdAggregate>& ts = d.aggregate.thresholds;
  const int left = 44, top = 12, plot_w = 420, plot_h = 200, bottom = 40;
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" role=\"img\" "
      "aria-label=\"Dice and IoU against the threshold\">",
      left + plot_w + 120, top + plot_h + bottom);
  auto x = [&](double t) { return left + plot_w * t; };
  auto y = [&](double v) { return top + plot_h * (1.0 - v); };
  for (int g = 0; g <= 4; ++g) {
    absl::StrAppend(&s, absl::StrFormat("<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" class=\"grid\"/>"
                                        "<text x=\"%d\" y=\"%.1f\" class=\"tick\" text-anchor=\"end\">%.2f</text>"
                                        "<text x=\"%.1f\" y=\"%d\" class=\"tick\" text-anchor=\"middle\">%.2f</text>",
                                        left, y(g / 4.0), left + plot_w, y(g / 4.0), left - 4, y(g / 4.0) + 4,
                                        g / 4.0, x(g / 4.0), top + plot_h + 16, g / 4.0));
  }
  struct Series {
    const char* name;
    const char* color;
    double ThresholdAggregate::*value;
  };
  int legend = 0;
  for (const Series& series : {Series{"dice_mean", "#3b6fd4", &ThresholdAggregate::dice_mean},
                               Series{"iou_mean", "#d4793b", &ThresholdAggregate::iou_mean}}) {
    std::string points;
    for (const ThresholdAggregate& t : ts) {
      const double v = t.*series.value;
      if (std::isnan(v)) continue;
      absl::StrAppend(&points, absl::StrFormat("%.1f,%.1f ", x(t.threshold), y(v)));
      absl::StrAppend(&s, absl::StrFormat("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"><title>%s at %g: "
                                          "%.4f</title></circle>",
                                          x(t.threshold), y(v), series.color, series.name, t.threshold, v));
    }
    absl::StrAppend(&s, absl::StrFormat("<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/>"
                                        "<text x=\"%d\" y=\"%d\" class=\"axis\" fill=\"%s\">%s</text>",
                                        points, series.color, left + plot_w + 12, top + 14 + 18 * legend, series.color,
                                        series.name));
    ++legend;
  }
  if (d.aggregate.best_threshold >= 0) {
    const ThresholdAggregate& b = ts[static_cast<size_t>(d.aggregate.best_threshold)];
    absl::StrAppend(&s, absl::StrFormat("<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" class=\"ci\" "
                                        "stroke-dasharray=\"4 3\"/><text x=\"%.1f\" y=\"%d\" class=\"tick\">best "
                                        "%g</text>",
                                        x(b.threshold), top, x(b.threshold), top + plot_h, x(b.threshold) + 4, top + 12,
                                        b.threshold));
  }
  absl::StrAppend(&s, absl::StrFormat("<text x=\"%d\" y=\"%d\" class=\"axis\" text-anchor=\"middle\">threshold "
                                      "(probability)</text>",
                                      left + plot_w / 2, top + plot_h + 34));
  return s + "</svg>";
}

// The class's worst rows that have a thumbnail, in the table's order, each with its id and Dice.
std::string Thumbnails(const ReportData& d, const ClassAggregate& ca) {
  std::string h;
  for (const auto& [dice, index] : ca.worst) {
    const StoredThumbnail* t = d.Thumbnail(ca.class_id, index);
    if (t == nullptr) continue;
    const std::string id = d.WorstId(index);
    absl::StrAppend(&h, "<figure data-index=\"", index, "\" data-class=\"", ca.class_id,
                    "\"><img src=\"data:image/jpeg;base64,", absl::Base64Escape(t->jpeg), "\" alt=\"",
                    HtmlEscape(absl::StrCat("row ", id, ", class ", d.ClassName(ca.class_id))),
                    "\"><figcaption><code>", HtmlEscape(id), "</code> · Dice ", FormatCell(dice),
                    t->slice > 0 ? absl::StrCat(" · slice ", t->slice) : "", "</figcaption></figure>\n");
  }
  return h.empty() ? h : "<div class=\"thumbs\">\n" + h + "</div>\n";
}

// A category's precision-recall curves (COCOeval's 101-point interpolated precision, all areas,
// 100 detections) at IoU 0.75 (orange, solid) and 0.5 (blue, dashed over it: equal curves stay
// visible). The title takes two lines so that no name or number is cut off.
std::string PrCurve(const InstanceCategory& c) {
  const int left = 34, top = 32, plot = 150, bottom = 30;
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" role=\"img\" "
      "aria-label=\"precision against recall, %s\"><text x=\"%d\" y=\"12\" class=\"axis\">%s</text>"
      "<text x=\"%d\" y=\"25\" class=\"tick\">AP50 %s, AP75 %s</text>",
      left + plot + 8, top + plot + bottom, HtmlEscape(c.name), 2, HtmlEscape(absl::StrCat(c.id, " ", c.name)), 2,
      FormatCell(c.ap50), FormatCell(c.ap75));
  auto x = [&](double r) { return left + plot * r; };
  auto y = [&](double p) { return top + plot * (1.0 - p); };
  for (int g = 0; g <= 2; ++g) {
    absl::StrAppend(&s, absl::StrFormat("<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" class=\"grid\"/>"
                                        "<text x=\"%d\" y=\"%.1f\" class=\"tick\" text-anchor=\"end\">%.1f</text>"
                                        "<text x=\"%.1f\" y=\"%d\" class=\"tick\" text-anchor=\"middle\">%.1f</text>",
                                        left, y(g / 2.0), left + plot, y(g / 2.0), left - 3, y(g / 2.0) + 4, g / 2.0,
                                        x(g / 2.0), top + plot + 14, g / 2.0));
  }
  const std::vector<double>& recall = CocoDefaultParams().recall_thresholds;
  for (auto [curve, style] :
       {std::pair<const std::vector<double>*, const char*>{&c.precision75, "stroke=\"#d4793b\" stroke-width=\"2.5\""},
        {&c.precision50, "stroke=\"#3b6fd4\" stroke-width=\"1.5\" stroke-dasharray=\"4 3\""}}) {
    std::string points;
    for (size_t r = 0; r < curve->size() && r < recall.size(); ++r) {
      if ((*curve)[r] < 0) continue;  // -1: no reference of the category counts.
      absl::StrAppend(&points, absl::StrFormat("%.1f,%.1f ", x(recall[r]), y((*curve)[r])));
    }
    if (!points.empty()) {
      absl::StrAppend(&s, absl::StrFormat("<polyline points=\"%s\" fill=\"none\" %s/>", points, style));
    }
  }
  absl::StrAppend(&s, absl::StrFormat("<text x=\"%.1f\" y=\"%d\" class=\"tick\" text-anchor=\"middle\">recall</text>",
                                      x(0.5), top + plot + 27));
  return s + "</svg>";
}

// COCO instance jobs: the 12 numbers, per category AP and counts, the precision-recall curves and
// the rows of lowest instance F1 with their thumbnails.
std::string InstancesHtml(const ReportData& d) {
  std::string h = absl::StrCat(
      "<h2>Instances (COCO mask AP)</h2>\n<p>COCOeval's segm numbers over ", d.instances.images,
      " evaluated images (IoU 0.50:0.95, maxDets 100; -1 where undefined).</p>\n<div class=\"table-wrap\">",
      HtmlTable(InstanceStatsTable(d)), "</div>\n<h3>Per category</h3>\n<div class=\"table-wrap\">",
      HtmlTable(InstanceCategoryTable(d)), "</div>\n<h3>Precision-recall curves</h3>\n<p>IoU 0.5 "
      "<span style=\"color:#3b6fd4\">blue, dashed</span>, IoU 0.75 <span style=\"color:#d4793b\">orange</span> "
      "(where they are equal, the dashes lie on the orange line); all areas, 100 detections per image.</p>\n"
      "<div class=\"thumbs\">\n");
  for (const InstanceCategory& c : d.instances.categories) h += PrCurve(c) + "\n";
  h += "</div>\n";
  if (d.instances.worst.empty()) return h;
  h += "<h3>Worst images by instance F1 (IoU 0.5)</h3>\n<div class=\"table-wrap\">" +
       HtmlTable(InstanceWorstTable(d)) + "</div>\n<p>Matched instances green, missed references blue, false "
       "detections red.</p>\n";
  std::string figures;
  for (const InstanceReport::Worst& w : d.instances.worst) {
    const StoredThumbnail* t = d.Thumbnail(kInstanceThumbnailClass, w.index);
    if (t == nullptr) continue;
    const std::string id = d.WorstId(w.index);
    absl::StrAppend(&figures, "<figure data-index=\"", w.index, "\" data-instances=\"1\"><img src=\"data:image/jpeg;base64,",
                    absl::Base64Escape(t->jpeg), "\" alt=\"", HtmlEscape(absl::StrCat("row ", id, ", instances")),
                    "\"><figcaption><code>", HtmlEscape(id), "</code> · F1 ", FormatCell(w.f1),
                    "</figcaption></figure>\n");
  }
  if (!figures.empty()) h += "<div class=\"thumbs\">\n" + figures + "</div>\n";
  return h;
}

// The page's head and style sheet (no external asset).
std::string PageHead(const v1::Job& job) {
  return R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Tally report )" +
                  HtmlEscape(job.job_id()) + R"(</title>
<style>
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:24px 32px;color:#1d232b;background:#fff}
h1{font-size:22px;margin:0 0 8px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d8dde3;padding-bottom:4px}
table{border-collapse:collapse;font-size:13px;margin:6px 0} th,td{border:1px solid #d8dde3;padding:4px 8px;text-align:right}
th{background:#f1f4f7} td.l,th.l{text-align:left} .meta{font-size:14px;color:#3c4650;line-height:1.6}
.state-succeeded{color:#137333;font-weight:600}.state-failed,.state-cancelled{color:#b3261e;font-weight:600}
svg .bar{fill:#3b6fd4} svg .bar.bg{fill:#a9b4c2} svg .ci{stroke:#111;stroke-width:1.5} svg .grid{stroke:#e3e7ec}
svg .tick{font-size:11px;fill:#3c4650} svg .axis{font-size:12px;fill:#3c4650} svg .axisline{stroke:#6b7682}
.hists{display:flex;flex-wrap:wrap;gap:14px} .hist h4{font-size:13px;margin:4px 0;font-weight:500}
.table-wrap{overflow-x:auto;max-width:100%}
.thumbs{display:flex;flex-wrap:wrap;gap:12px;margin:8px 0} .thumbs figure{margin:0;font-size:12px;color:#3c4650}
.thumbs img{display:block;border:1px solid #d8dde3;image-rendering:pixelated} .thumbs figcaption{max-width:260px;overflow-wrap:anywhere}
.key{display:inline-block;width:11px;height:11px;vertical-align:-1px;border:1px solid #777}
</style></head><body>
)";
}

// The title and what the job was: state, model, manifest, row counts, time, provenance.
std::string JobMeta(const ReportData& d) {
  const v1::Job& job = d.record->job;
  std::string h;
  absl::StrAppend(&h, "<h1>Tally report <code>", HtmlEscape(job.job_id()), "</code></h1>\n<div class=\"meta\">");
  for (const ReportFact& f : JobFacts(d)) {
    std::string text = HtmlEscape(f.text);
    if (f.label == "State") {
      text = absl::StrCat("<span class=\"state-", JobStateName(job.state()), "\">", text, "</span>");
    } else if (f.strong) {
      text = absl::StrCat("<strong>", text, "</strong>");
    }
    if (!f.path.empty()) {
      text = f.text.empty() ? absl::StrCat("<code>", HtmlEscape(f.path), "</code>")
                            : absl::StrCat("<code>", HtmlEscape(f.path), "</code> (", text, ")");
    }
    absl::StrAppend(&h, HtmlEscape(f.label), ": ", text, "<br>");
  }
  h += "</div>\n";
  return h;
}

// Each selected metric's per-image histogram, per class.
std::string Distributions(const ReportData& d) {
  std::string h;
  h += "<h2>Per-image distributions</h2>\n<p>Per class, each selected metric's per-image values in 20 bins "
       "(distances over [0, largest finite value]; infinite ones are counted in the table).</p>\n";
  for (Metric m : d.metrics()) {
    const std::string label = m == Metric::kDice ? "Dice" : std::string(MetricName(m));
    absl::StrAppend(&h, "<h3>", label, "</h3>\n<div class=\"hists\">\n");
    for (const ClassAggregate& ca : d.aggregate.classes) {
      const MetricAggregate& ma = ca.metrics[static_cast<int>(m)];
      if (ma.count == 0 && ma.inf_count == 0) continue;  // No image has a value (lesions: the background).
      absl::StrAppend(&h, "<div class=\"hist\"><h4>class ", d.ClassName(ca.class_id),
                      d.IsForeground(ca.class_id) ? "" : " (background)", " — ", ma.count, " images",
                      ma.inf_count > 0 ? absl::StrCat(", ", ma.inf_count, " inf") : "", "</h4>",
                      MetricHistogram(ca.histograms[static_cast<int>(m)], label, d.ClassName(ca.class_id)), "</div>\n");
    }
    h += "</div>\n";
  }
  return h;
}

// The worst rows of each foreground class, with their thumbnails.
std::string WorstImages(const ReportData& d) {
  std::string h;
  h += "<h2>Worst images by Dice</h2>\n";
  // The legend only where some class shown here has thumbnails (an instance job's are the matching's,
  // shown with the worst images by instance F1).
  bool any = false;
  for (const auto& [key, thumbnail] : d.thumbnails) any |= !(d.config.instance_job() && key.first == kInstanceThumbnailClass);
  if (any) {
    h += "<p class=\"legend\">Thumbnails: the image, and the image with the class coloured: <span class=\"key\" "
         "style=\"background:#00c800\"></span> reference and prediction, <span class=\"key\" "
         "style=\"background:#eb1e1e\"></span> prediction only (false positive), <span class=\"key\" "
         "style=\"background:#1e6eff\"></span> reference only (false negative), <span class=\"key\" "
         "style=\"background:#808080\"></span> ignored. Without an image, the reference is shown in white.</p>\n";
  }
  for (const ClassAggregate& ca : d.aggregate.classes) {
    if (!d.IsForeground(ca.class_id) || ca.worst.empty()) continue;
    const std::string note = ReportData::DiceTieNote(ca);
    absl::StrAppend(&h, "<h3>class ", d.ClassName(ca.class_id), "</h3>",
                    note.empty() ? "" : "<p class=\"ties\">" + HtmlEscape(note) + "</p>");
    h += Thumbnails(d, ca);
    h += HtmlTable(WorstTable(d, ca));
  }
  return h;
}

// Failed rows, grouped by reason, then listed.
std::string Failures(const ReportData& d) {
  std::string h;
  absl::StrAppend(&h, "<h2>Failures (", d.failures.size(), ")</h2>\n");
  if (!d.failure_groups.empty()) {
    h += "<ul class=\"reasons\">\n";
    for (const FailureGroup& g : d.failure_groups) absl::StrAppend(&h, "<li>", g.count, " &times; ", HtmlEscape(g.kind), "</li>\n");
    h += "</ul>\n";
  }
  if (d.failures.empty()) {
    absl::StrAppend(&h, "<p>", HtmlEscape(NoFailuresStatement(d)), "</p>\n");
  } else {
    if (RowsNotEvaluated(d) > 0) {
      absl::StrAppend(&h, "<p>", RowsNotEvaluated(d), " more rows were not evaluated (", HtmlEscape(NotEvaluatedReason(d)),
                      ").</p>\n");
    }
    h += HtmlTable(FailureTable(d));
    if (d.failures.size() > kMaxFailuresShown) {
      absl::StrAppend(&h, "<p>... and ", d.failures.size() - kMaxFailuresShown, " more in report.json</p>\n");
    }
  }
  return h;
}

}  // namespace

std::string ReportHtml(const ReportData& d) {
  const v1::Job& job = d.record->job;
  std::string h = PageHead(job);
  h += JobMeta(d);
  for (const std::string& w : d.warnings) absl::StrAppend(&h, "<p class=\"warn\">Warning: ", HtmlEscape(w), "</p>\n");
  if (d.instances.present) h += InstancesHtml(d);
  if (d.panoptic.present) {
    h += "<h2>Panoptic quality</h2>\n<p>panopticapi's PQ, SQ and RQ; a segment matches at IoU &gt; 0.5.</p>\n"
         "<div class=\"table-wrap\">" + HtmlTable(PanopticTable(d)) + "</div>\n<h3>Per category</h3>\n"
         "<div class=\"table-wrap\">" + HtmlTable(PanopticCategoryTable(d)) + "</div>\n";
  }
  h += "<h2>Per class</h2>\n<p>Means over images (NaN skipped; inf skipped and counted); " +
       HtmlEscape(IntervalSentence(d)) + "; global = from summed counts.</p>\n<div class=\"table-wrap\">" +
       HtmlTable(ClassTable(d)) + "</div>\n";
  if (!d.config.iou_thresholds.empty()) {
    h += "<p>Pr@t: the share of images whose IoU is at least t (a referring set's precision at t).</p>\n";
  }
  if (HasLesionTable(d)) {
    h += "<h2>Lesions</h2>\n<p>Per foreground class: lesion-wise means over images and the values pooled over every "
         "lesion (global); tp, fp, fn are lesion counts.</p>\n<div class=\"table-wrap\">" + HtmlTable(LesionTable(d)) +
         "</div>\n";
  }
  h += GroupsHtml(d);
  h += CalibrationHtml(d);
  h += std::string("<h2>Mean Dice per class") + (d.interval == IntervalKind::kNone ? "" : " (with its 95% interval)") +
       "</h2>\n" + DiceBarChart(d) + "\n";
  if (!d.aggregate.thresholds.empty()) {
    h += "<h2>Threshold sweep (foreground class)</h2>\n<p>Dice and IoU means over images at each probability "
         "threshold; the other metrics use the primary threshold 0.5.</p>\n" + ThresholdCurve(d) +
         "\n<div class=\"table-wrap\">" + HtmlTable(ThresholdTable(d)) + "</div>\n";
  }
  h += Distributions(d);
  h += WorstImages(d);
  h += Failures(d);
  if (!d.workers.empty()) h += "<h2>Workers</h2>\n" + HtmlTable(WorkerTable(d));
  h += "<h2>Parameters</h2>\n" + HtmlTable(ParameterTable(d));
  h += "</body></html>\n";
  return h;
}

}  // namespace tally
