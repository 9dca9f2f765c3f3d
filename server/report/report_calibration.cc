// --metrics calibration (metrics/calibration.h) in each report format: report.json's "calibration",
// a table and the reliability diagrams (inline SVG) in report.html, the table in summary.md.
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/json_writer.h"
#include "server/report/report_formats.h"
#include "server/report/report_table.h"

namespace tally {
namespace {

void FiguresJson(const CalibrationFigures& f, bool fine, JsonWriter& w) {
  w.Field("pixels", f.pixels).Field("ece", f.ece);
  if (fine) w.Field("ace", f.ace);
  w.Key("reliability").BeginArray();
  for (const ReliabilityBin& b : f.bins) {
    w.BeginObject().Field("lo", b.lo).Field("hi", b.hi).Field("pixels", b.pixels).Field("accuracy", b.accuracy);
    w.Field("confidence", b.confidence).EndObject();
  }
  w.EndArray();
}

Table CalibrationTable(const ReportData& d) {
  const CalibrationSummary& s = d.calibration_summary;
  Table t;
  t.header = {"", "pixels", "ECE"};
  if (s.fine) t.header.push_back("ACE");
  t.left = {true, false, false, false};
  auto row = [&](const std::string& name, const CalibrationFigures& f) {
    std::vector<TableCell> r = {{name}, {absl::StrCat(f.pixels)}, {FormatCell(f.ece)}};
    if (s.fine) r.push_back({FormatCell(f.ace)});
    t.rows.push_back(std::move(r));
  };
  row("top label", s.top);
  for (size_t c = 0; c < s.classes.size(); ++c) row(absl::StrCat("class ", d.ClassName(static_cast<int>(c))), s.classes[c]);
  std::vector<TableCell> mean = {{"classwise (mean over classes)"}, {""}, {FormatCell(s.classwise_ece)}};
  if (s.fine) mean.push_back({FormatCell(s.classwise_ace)});
  t.rows.push_back(std::move(mean));
  return t;
}

std::string Sentence(const ReportData& d) {
  return absl::StrCat(
      "Over every pixel of ", d.calibration_rows, " rows: ECE with 15 equal-width bins (top label; per class its own "
      "probability, classwise ECE their mean)",
      d.calibration_summary.fine ? "; ACE with 15 equal-mass bins, exact to 1/65536 in probability" : "", ".");
}

// A reliability diagram: accuracy against confidence per bin, the diagonal, bars' shade by pixels.
std::string ReliabilitySvg(const std::string& title, const CalibrationFigures& f) {
  constexpr double kSize = 220, kPad = 30;
  std::string svg = absl::StrFormat(
      "<figure class=\"reliability\"><svg width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" role=\"img\">"
      "<rect x=\"%.0f\" y=\"10\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#999\"/>",
      kSize + kPad + 10, kSize + kPad + 10, kSize + kPad + 10, kSize + kPad + 10, kPad, kSize, kSize);
  int64_t most = 0;
  for (const ReliabilityBin& b : f.bins) most = std::max(most, b.pixels);
  for (const ReliabilityBin& b : f.bins) {
    if (b.pixels == 0 || std::isnan(b.accuracy)) continue;
    const double x = kPad + b.lo * kSize, w = (b.hi - b.lo) * kSize, h = b.accuracy * kSize;
    const double shade = 0.25 + 0.75 * std::sqrt(static_cast<double>(b.pixels) / static_cast<double>(most));
    absl::StrAppendFormat(&svg,
                          "<rect class=\"bin\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"#3b6ea5\" "
                          "fill-opacity=\"%.2f\" data-lo=\"%.6f\" data-accuracy=\"%.17g\" data-confidence=\"%.17g\" "
                          "data-pixels=\"%d\"><title>[%.3f, %.3f): %d pixels, accuracy %.4f, confidence %.4f</title></rect>",
                          x, 10 + kSize - h, w, h, shade, b.lo, b.accuracy, b.confidence, b.pixels, b.lo, b.hi, b.pixels,
                          b.accuracy, b.confidence);
    absl::StrAppendFormat(&svg, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"2\" fill=\"#c0392b\"/>", kPad + b.confidence * kSize,
                          10 + kSize - b.accuracy * kSize);
  }
  absl::StrAppendFormat(&svg,
                        "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"10\" stroke=\"#555\" stroke-dasharray=\"4 3\"/>"
                        "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\" text-anchor=\"middle\">confidence</text>"
                        "<text x=\"10\" y=\"%.0f\" font-size=\"10\" transform=\"rotate(-90 10 %.0f)\" "
                        "text-anchor=\"middle\">accuracy</text></svg>",
                        kPad, 10 + kSize, kPad + kSize, kPad + kSize / 2, kSize + kPad + 5, 10 + kSize / 2, 10 + kSize / 2);
  absl::StrAppend(&svg, "<figcaption>", HtmlEscape(title), " · ECE ", FormatCell(f.ece), "</figcaption></figure>\n");
  return svg;
}

}  // namespace

void CalibrationJson(const ReportData& d, JsonWriter& w) {
  if (d.calibration.empty()) return;
  const CalibrationSummary& s = d.calibration_summary;
  w.Key("calibration").BeginObject().Field("rows", d.calibration_rows).Field("bins", kCalibrationBins);
  w.Field("fine_bins", kCalibrationFineBins).Field("fine_rows", d.calibration_fine_rows);
  w.Field("ece", s.top.ece).Field("classwise_ece", s.classwise_ece);
  if (s.fine) w.Field("ace", s.top.ace).Field("classwise_ace", s.classwise_ace);
  w.Key("top_label").BeginObject();
  FiguresJson(s.top, s.fine, w);
  w.EndObject().Key("classes").BeginArray();
  for (size_t c = 0; c < s.classes.size(); ++c) {
    w.BeginObject().Field("class", ClassLabel(d.config, static_cast<int>(c)));
    FiguresJson(s.classes[c], s.fine, w);
    w.EndObject();
  }
  w.EndArray().EndObject();
}

std::string CalibrationMarkdown(const ReportData& d) {
  if (d.calibration.empty()) return "";
  return absl::StrCat("\n## Calibration\n\n", Sentence(d), "\n\n", MarkdownTable(CalibrationTable(d)));
}

std::string CalibrationHtml(const ReportData& d) {
  if (d.calibration.empty()) return "";
  const CalibrationSummary& s = d.calibration_summary;
  std::string h = absl::StrCat("<h2>Calibration</h2>\n<p>", HtmlEscape(Sentence(d)), "</p>\n<div class=\"table-wrap\">",
                               HtmlTable(CalibrationTable(d)), "</div>\n<div class=\"thumbs\">\n");
  h += ReliabilitySvg("top label", s.top);
  for (size_t c = 0; c < s.classes.size(); ++c) {
    if (s.classes[c].pixels > 0) h += ReliabilitySvg(absl::StrCat("class ", d.ClassName(static_cast<int>(c))), s.classes[c]);
  }
  return h + "</div>\n";
}

}  // namespace tally
