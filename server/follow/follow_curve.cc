#include "server/follow/follow_curve.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_util.h"
#include "base/json_writer.h"
#include "base/number_format.h"
#include "base/status_macros.h"
#include "common/sources/csv.h"
#include "server/report/report_table.h"

namespace tally {
namespace {

// Every metric's name, in the order the points first name them.
std::vector<std::string> MetricNames(const FollowCurve& curve) {
  std::vector<std::string> names;
  for (const CurvePoint& p : curve.points) {
    for (const CurveMetric& m : p.metrics) {
      if (std::find(names.begin(), names.end(), m.name) == names.end()) names.push_back(m.name);
    }
  }
  return names;
}

const CurveMetric* Find(const CurvePoint& p, const std::string& name) {
  for (const CurveMetric& m : p.metrics) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

const char* DecisionColour(const std::string& decision) {
  if (decision == "best") return "#1a7f37";
  if (decision == "worse") return "#cf222e";
  if (decision == "not better") return "#0969da";
  return "#8c959f";
}

// One metric against the step: its means as a line, its intervals as a band, each point coloured
// by its decision. Empty when no point has the metric.
std::string MetricSvg(const FollowCurve& curve, const std::string& name) {
  struct P { double x, mean, lo, hi; std::string decision; };
  std::vector<P> pts;
  for (const CurvePoint& p : curve.points) {
    const CurveMetric* m = Find(p, name);
    if (m != nullptr && std::isfinite(m->mean)) pts.push_back({static_cast<double>(p.step), m->mean, m->lo, m->hi, p.decision});
  }
  if (pts.empty()) return "";
  double x0 = pts.front().x, x1 = pts.back().x, y0 = std::numeric_limits<double>::infinity(), y1 = -y0;
  for (const P& p : pts) {
    for (double v : {p.mean, p.lo, p.hi}) {
      if (std::isfinite(v)) y0 = std::min(y0, v), y1 = std::max(y1, v);
    }
  }
  if (x1 <= x0) x1 = x0 + 1;
  if (y1 <= y0) y1 = y0 + 1e-6;
  const double w = 640, h = 220, pad = 36;
  const auto X = [&](double x) { return pad + (w - 2 * pad) * (x - x0) / (x1 - x0); };
  const auto Y = [&](double y) { return h - pad + (2 * pad - h) * (y - y0) / (y1 - y0); };
  std::string band_top, band_bottom, line, dots;
  for (const P& p : pts) {
    if (std::isfinite(p.lo) && std::isfinite(p.hi)) {
      absl::StrAppendFormat(&band_top, "%.1f,%.1f ", X(p.x), Y(p.hi));
      band_bottom = absl::StrFormat("%.1f,%.1f ", X(p.x), Y(p.lo)) + band_bottom;
    }
    absl::StrAppendFormat(&line, "%.1f,%.1f ", X(p.x), Y(p.mean));
    absl::StrAppendFormat(&dots, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>step %s: %s (%s)</title></circle>",
                          X(p.x), Y(p.mean), DecisionColour(p.decision), FormatDouble(p.x), FormatDouble(p.mean),
                          HtmlEscape(p.decision));
  }
  return absl::StrFormat(
      "<figure><figcaption>%s against the step (band: 95 %% interval)</figcaption>"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\">"
      "<polygon points=\"%s%s\" fill=\"#0969da\" fill-opacity=\"0.15\"/>"
      "<polyline points=\"%s\" fill=\"none\" stroke=\"#0969da\" stroke-width=\"1.5\"/>%s"
      "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\">%s</text><text x=\"%.0f\" y=\"%.0f\" font-size=\"11\">%s</text>"
      "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\">step %s</text><text x=\"%.0f\" y=\"%.0f\" font-size=\"11\" "
      "text-anchor=\"end\">step %s</text></svg></figure>\n",
      HtmlEscape(name), w, h, w, h, band_top, band_bottom, line, dots, 2.0, Y(y1) - 4, FormatDouble(y1), 2.0, Y(y0) + 12,
      FormatDouble(y0), pad, h - 6, FormatDouble(x0), w - pad, h - 6, FormatDouble(x1));
}

}  // namespace

std::string CurveCsv(const FollowCurve& curve) {
  const std::vector<std::string> names = MetricNames(curve);
  std::string out = "step,checkpoint,job,rows,rows_total,decision,reason,best_step,race_rows,race_lo,race_hi";
  for (const std::string& n : names) absl::StrAppend(&out, ",", CsvField(n), ",", CsvField(n + "_lo"), ",", CsvField(n + "_hi"));
  out += "\n";
  for (const CurvePoint& p : curve.points) {
    absl::StrAppend(&out, p.step, ",", CsvField(p.checkpoint), ",", CsvField(p.job), ",", p.rows, ",", p.rows_total, ",",
                    CsvField(p.decision), ",", CsvField(p.reason), ",", p.best_step, ",", p.race_rows, ",",
                    FormatDouble(p.race_lo), ",", FormatDouble(p.race_hi));
    for (const std::string& n : names) {
      const CurveMetric* m = Find(p, n);
      if (m == nullptr) {
        out += ",,,";
      } else {
        absl::StrAppend(&out, ",", FormatDouble(m->mean), ",", FormatDouble(m->lo), ",", FormatDouble(m->hi));
      }
    }
    out += "\n";
  }
  return out;
}

std::string CurveJson(const FollowCurve& curve) {
  JsonWriter w;
  w.BeginObject().Field("follow", curve.follow).Field("folder", curve.folder).Field("metric", curve.metric);
  w.Key("points").BeginArray();
  for (const CurvePoint& p : curve.points) {
    w.BeginObject().Field("step", p.step).Field("checkpoint", p.checkpoint).Field("job", p.job);
    w.Field("rows", p.rows).Field("rows_total", p.rows_total).Field("decision", p.decision);
    if (!p.reason.empty()) w.Field("reason", p.reason);
    w.Field("best_step", p.best_step);
    w.Key("race").BeginObject().Field("rows", p.race_rows).Field("lo", p.race_lo).Field("hi", p.race_hi).EndObject();
    w.Field("landed_unix", p.landed_unix).Field("taken_unix", p.taken_unix).Field("decided_unix", p.decided_unix);
    w.Key("metrics").BeginObject();
    for (const CurveMetric& m : p.metrics) {
      w.Key(m.name).BeginObject().Field("mean", m.mean).Field("lo", m.lo).Field("hi", m.hi).EndObject();
    }
    w.EndObject().EndObject();
  }
  w.EndArray().EndObject();
  return w.str() + "\n";
}

std::string CurveHtml(const FollowCurve& curve) {
  std::string out = absl::StrCat(
      "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>Tally follow ", HtmlEscape(curve.follow),
      "</title><style>body{font:14px sans-serif;margin:2em}table{border-collapse:collapse}td,th{padding:2px 8px;"
      "border-bottom:1px solid #ddd;text-align:right}</style></head><body>\n<h1>Follow ", HtmlEscape(curve.follow),
      "</h1>\n<p>Checkpoints of ", HtmlEscape(curve.folder), "; best by ", HtmlEscape(curve.metric),
      ". Points: green the best when evaluated, red decided worse by the race (stopped), blue not better, grey "
      "failed, gone or skipped.</p>\n");
  for (const std::string& n : MetricNames(curve)) out += MetricSvg(curve, n);
  out += "<table><tr><th>step</th><th>checkpoint</th><th>rows</th><th>decision</th><th>best step</th>"
         "<th>race rows</th><th>race interval</th></tr>\n";
  for (const CurvePoint& p : curve.points) {
    absl::StrAppend(&out, "<tr><td>", p.step, "</td><td>", HtmlEscape(p.checkpoint), "</td><td>", p.rows, " / ",
                    p.rows_total, "</td><td>", HtmlEscape(p.decision),
                    p.reason.empty() ? "" : absl::StrCat(": ", HtmlEscape(p.reason)), "</td><td>", p.best_step,
                    "</td><td>", p.race_rows, "</td><td>[", FormatDouble(p.race_lo), ", ", FormatDouble(p.race_hi),
                    "]</td></tr>\n");
  }
  return out + "</table>\n</body></html>\n";
}

absl::Status WriteCurveFiles(const FollowCurve& curve, const std::string& folder) {
  RETURN_IF_ERROR(MakeDirs(folder));
  RETURN_IF_ERROR(WriteFileAtomically(folder + "/curve.csv", CurveCsv(curve)));
  RETURN_IF_ERROR(WriteFileAtomically(folder + "/curve.json", CurveJson(curve)));
  return WriteFileAtomically(folder + "/curve.html", CurveHtml(curve));
}

}  // namespace tally
