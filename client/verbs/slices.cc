// tally slices OUT: the failing slices of a finished job's report folder (metrics/slice_search.h).
// Each row's value is its per_image.csv metric (--slice-metric: dice or iou averaged over the
// foreground classes the row defines, or dice:K / iou:K for class K); its attributes are the
// manifest's columns (the one report.json records, or --manifest), paths and ids left out, numeric
// columns with more than 20 values binned into --slice-bins quantile bins.
#include <stdlib.h>
#include <sys/stat.h>

#include <array>
#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <simdjson.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/file_util.h"
#include "base/json_writer.h"
#include "base/status_macros.h"
#include "client/verbs/verb_util.h"
#include "client/verbs/verbs.h"
#include "common/security/data_roots.h"
#include "common/sources/csv.h"
#include "metrics/slice_search.h"

namespace tally {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

absl::StatusOr<std::vector<CsvRecord>> ReadCsv(const std::string& what, const std::string& path) {
  ClientFileLimits limits;
  limits.max_bytes = int64_t{64} << 30;
  limits.max_bytes_flag = "(" + what + ")";
  ASSIGN_OR_RETURN(std::string text, ReadClientFile(what, path, limits));
  return SplitCsv(text, path);
}

int Column(const std::vector<std::string>& header, const std::string& name) {
  for (size_t i = 0; i < header.size(); ++i) {
    if (header[i] == name) return static_cast<int>(i);
  }
  return -1;
}

// What per_image.csv says of each row beside its value: its reference and predicted foreground pixels
// (the foreground classes' tp + fn and tp + fp) and its pixels counted (one class's tp + fp + fn + tn).
struct RowCounts {
  std::vector<double> ref, pred, pixels;
  // Where per_image.csv has the derived columns (jobs with groups or slices): the reference's
  // components over the classes >= 1, and the image's mean intensity.
  std::vector<double> components, intensity;
  std::vector<double> ece, confidence;  // --metrics calibration jobs: the row's top-label calibration.
};

// Each row's value (by index, NaN where none): the metric over the foreground classes, or one class.
absl::StatusOr<std::vector<double>> RowValues(const std::string& path, const std::string& metric, bool background,
                                               std::vector<std::string>* ids, RowCounts* counts) {
  std::string name = metric;
  int cls = -1;
  if (const size_t colon = metric.find(':'); colon != std::string::npos) {
    name = metric.substr(0, colon);
    if (!absl::SimpleAtoi(metric.substr(colon + 1), &cls) || cls < 0) {
      return absl::InvalidArgumentError(absl::StrCat("--slice-metric '", metric, "': expected dice, iou, dice:K or iou:K"));
    }
  }
  if (name != "dice" && name != "iou") {
    return absl::InvalidArgumentError(absl::StrCat("--slice-metric '", metric, "': expected dice, iou, dice:K or iou:K"));
  }
  ASSIGN_OR_RETURN(std::vector<CsvRecord> csv, ReadCsv("per_image.csv", path));
  if (csv.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": empty"));
  const int index_col = Column(csv[0].fields, "index"), class_col = Column(csv[0].fields, "class"),
            value_col = Column(csv[0].fields, name), id_col = Column(csv[0].fields, "id");
  if (index_col < 0 || class_col < 0 || value_col < 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no index, class or ", name, " column"));
  }
  std::map<int64_t, std::pair<double, int>> sums;
  // Reference, predicted foreground; counted; components, intensity.
  std::map<int64_t, std::array<double, 7>> pixels;
  const int comp_col = Column(csv[0].fields, "components"), int_col = Column(csv[0].fields, "mean_intensity");
  const int ece_col = Column(csv[0].fields, "ece"), conf_col = Column(csv[0].fields, "confidence");
  const int count_col[4] = {Column(csv[0].fields, "tp"), Column(csv[0].fields, "fp"), Column(csv[0].fields, "fn"),
                            Column(csv[0].fields, "tn")};
  int64_t last = -1;
  for (size_t r = 1; r < csv.size(); ++r) {
    const std::vector<std::string>& f = csv[r].fields;
    int64_t index;
    int c;
    double v;
    if (f.size() <= static_cast<size_t>(std::max({index_col, class_col, value_col})) ||
        !absl::SimpleAtoi(f[index_col], &index) || !absl::SimpleAtoi(f[class_col], &c) || index < 0) {
      return absl::InvalidArgumentError(absl::StrCat(path, " line ", csv[r].line, ": not a row of per_image.csv"));
    }
    // Rows are sized by the largest index: held to the manifest's row budget before anything is.
    if (index >= ManifestLimits{}.max_rows) {
      return absl::InvalidArgumentError(absl::StrCat(path, " line ", csv[r].line, ": index ", index,
                                                     " is past the ", ManifestLimits{}.max_rows, " rows a manifest may have"));
    }
    last = std::max(last, index);
    if (id_col >= 0 && static_cast<size_t>(id_col) < f.size()) {
      if (ids->size() <= static_cast<size_t>(index)) ids->resize(static_cast<size_t>(index) + 1);
      (*ids)[static_cast<size_t>(index)] = f[id_col];
    }
    auto& [sum, n] = sums[index];
    double k[4] = {0, 0, 0, 0};
    for (int j = 0; j < 4; ++j) {
      if (count_col[j] >= 0 && static_cast<size_t>(count_col[j]) < f.size()) (void)absl::SimpleAtod(f[count_col[j]], &k[j]);
    }
    std::array<double, 7>& px = pixels[index];
    px[2] = k[0] + k[1] + k[2] + k[3];
    if (c != 0 || background) px[0] += k[0] + k[2], px[1] += k[0] + k[1];
    double x = 0;
    if (comp_col >= 0 && c >= 1 && static_cast<size_t>(comp_col) < f.size() && absl::SimpleAtod(f[comp_col], &x)) px[3] += x;
    if (int_col >= 0 && static_cast<size_t>(int_col) < f.size()) px[4] = absl::SimpleAtod(f[int_col], &x) ? x : kNaN;
    if (ece_col >= 0 && static_cast<size_t>(ece_col) < f.size()) px[5] = absl::SimpleAtod(f[ece_col], &x) ? x : kNaN;
    if (conf_col >= 0 && static_cast<size_t>(conf_col) < f.size()) px[6] = absl::SimpleAtod(f[conf_col], &x) ? x : kNaN;
    const bool wanted = cls >= 0 ? c == cls : (c != 0 || background);
    if (wanted && absl::SimpleAtod(f[value_col], &v) && std::isfinite(v)) {
      sum += v;
      ++n;
    }
  }
  std::vector<double> values(static_cast<size_t>(last + 1), kNaN);
  for (const auto& [index, s] : sums) values[index] = s.second > 0 ? s.first / s.second : kNaN;
  std::vector<double>* into[7] = {&counts->ref,       &counts->pred, &counts->pixels,    &counts->components,
                                 &counts->intensity, &counts->ece,  &counts->confidence};
  for (int j = 0; j < 7; ++j) {
    if ((j == 3 && comp_col < 0) || (j == 4 && int_col < 0) || (j == 5 && ece_col < 0) || (j == 6 && conf_col < 0)) continue;
    into[j]->assign(values.size(), kNaN);
    for (const auto& [index, px] : pixels) (*into[j])[index] = px[j];
  }
  return values;
}

// The manifest's columns as attributes (one value per data row), paths and ids aside; numeric
// columns with too many values binned. Rows per_image.csv does not have (failed: `present` NaN)
// have no values, in bins or candidates, as in the report's search.
absl::StatusOr<std::vector<SliceAttribute>> Attributes(const std::string& manifest, const std::vector<double>& present,
                                                       int bins, int max_values) {
  const size_t rows = present.size();
  ASSIGN_OR_RETURN(std::vector<CsvRecord> csv, ReadCsv("the manifest", manifest));
  if (csv.empty()) return absl::InvalidArgumentError(absl::StrCat(manifest, ": empty"));
  static const std::set<std::string> kLeftOut = {"image", "mask", "prediction", "id", "coco_ann_ids"};
  std::vector<SliceAttribute> out;
  for (size_t c = 0; c < csv[0].fields.size(); ++c) {
    if (kLeftOut.count(csv[0].fields[c]) > 0) continue;
    SliceAttribute a;
    a.name = csv[0].fields[c];
    a.values.resize(rows);
    std::set<std::string> distinct;
    std::vector<double> numbers(rows, kNaN);
    bool numeric = true;
    for (size_t r = 1; r < csv.size() && r - 1 < rows; ++r) {
      a.values[r - 1] = c < csv[r].fields.size() && !std::isnan(present[r - 1]) ? csv[r].fields[c] : "";
      if (!a.values[r - 1].empty()) {
        distinct.insert(a.values[r - 1]);
        numeric = numeric && absl::SimpleAtod(a.values[r - 1], &numbers[r - 1]);
      }
    }
    // Numbers with many values are binned; few values (or text) are searched as they are written.
    if (numeric && static_cast<int>(distinct.size()) > max_values) a = NumericSliceAttribute(a.name, numbers, bins, max_values);
    out.push_back(std::move(a));
  }
  return out;
}

// Properties of each row derived from its counts, as attributes (binned where they have many values):
// derived:fg_fraction (reference foreground pixels / pixels counted), derived:volume_ratio (predicted /
// reference foreground; none where the reference has none), derived:pixels (pixels counted); and
// where per_image.csv has them, derived:components, derived:mean_intensity, derived:ece and
// derived:confidence. In the report's order
// (docs/reports.md "Groups"), so that `tally slices OUT` searches what --find-slices did.
void AddDerived(const RowCounts& c, int bins, int max_values, std::vector<SliceAttribute>* out) {
  std::vector<double> fg, ratio;
  for (size_t i = 0; i < c.ref.size(); ++i) {
    fg.push_back(c.pixels[i] > 0 ? c.ref[i] / c.pixels[i] : kNaN);
    ratio.push_back(c.ref[i] > 0 ? c.pred[i] / c.ref[i] : kNaN);
  }
  out->push_back(NumericSliceAttribute("derived:fg_fraction", fg, bins, max_values));
  out->push_back(NumericSliceAttribute("derived:volume_ratio", ratio, bins, max_values));
  if (!c.components.empty()) out->push_back(NumericSliceAttribute("derived:components", c.components, bins, max_values));
  out->push_back(NumericSliceAttribute("derived:pixels", c.pixels, bins, max_values));
  if (!c.intensity.empty()) out->push_back(NumericSliceAttribute("derived:mean_intensity", c.intensity, bins, max_values));
  if (!c.ece.empty()) out->push_back(NumericSliceAttribute("derived:ece", c.ece, bins, max_values));
  if (!c.confidence.empty()) out->push_back(NumericSliceAttribute("derived:confidence", c.confidence, bins, max_values));
}

void PrintText(const SliceSearch& s, const SliceOptions& o, const std::vector<std::string>& ids) {
  std::cout << absl::StrFormat(
      "%d rows; %d attributes searched; %d candidate slices, %d tested (at least %d rows), Benjamini-Hochberg at "
      "q = %g over the %d tested: %d significant, %d shown (the others folded into them)\n",
      s.rows, s.attributes.size(), s.candidates, s.tested, o.min_rows, o.q, s.tested, s.significant, s.slices.size());
  for (const std::string& why : s.skipped) std::cout << "  not searched: " << why << "\n";
  for (const Slice& x : s.slices) {
    std::cout << absl::StrFormat("\n%s: %d rows, mean %.4f [%.4f, %.4f] against %.4f [%.4f, %.4f] outside; "
                                 "effect %.4f [%.4f, %.4f]; %s p %.3g, adjusted %.3g\n",
                                 x.name, x.rows, x.mean_inside, x.inside_lo, x.inside_hi, x.mean_outside,
                                 x.outside_lo, x.outside_hi, x.effect, x.effect_lo, x.effect_hi, x.test, x.p,
                                 x.p_adjusted);
    std::string worst;
    for (int64_t r : x.worst_rows) {
      absl::StrAppend(&worst, worst.empty() ? "" : ", ", r, static_cast<size_t>(r) < ids.size() && !ids[r].empty() ? " (" + ids[r] + ")" : "");
    }
    std::cout << "  worst rows: " << worst << "\n";
    for (const std::string& f : x.folded) std::cout << "  folded: " << f << "\n";
  }
}

std::string Json(const SliceSearch& s, const SliceOptions& o, const std::string& metric) {
  JsonWriter w;
  w.BeginObject().Field("metric", metric).Field("rows", s.rows).Field("candidates", s.candidates);
  w.Field("tested", s.tested).Field("significant", s.significant).Field("q", o.q).Field("min_rows", o.min_rows);
  w.Key("attributes").BeginArray();
  for (const std::string& a : s.attributes) w.String(a);
  w.EndArray().Key("not_searched").BeginArray();
  for (const std::string& a : s.skipped) w.String(a);
  w.EndArray().Key("slices").BeginArray();
  for (const Slice& x : s.slices) {
    w.BeginObject().Field("slice", x.name).Key("conditions").BeginArray();
    for (const SliceCondition& c : x.conditions) w.BeginObject().Field("attribute", c.attribute).Field("value", c.value).EndObject();
    w.EndArray().Field("rows", x.rows).Field("mean_inside", x.mean_inside).Field("inside_lo", x.inside_lo);
    w.Field("inside_hi", x.inside_hi).Field("mean_outside", x.mean_outside).Field("outside_lo", x.outside_lo);
    w.Field("outside_hi", x.outside_hi).Field("effect", x.effect).Field("effect_lo", x.effect_lo);
    w.Field("effect_hi", x.effect_hi).Field("test", x.test).Field("p", x.p).Field("p_adjusted", x.p_adjusted);
    w.Key("worst_rows").BeginArray();
    for (int64_t r : x.worst_rows) w.Int(r);
    w.EndArray().Key("folded").BeginArray();
    for (const std::string& f : x.folded) w.String(f);
    w.EndArray().EndObject();
  }
  w.EndArray().EndObject();
  return w.str();
}

}  // namespace

int SlicesOfFolder(const SlicesFlags& f, const std::string& dir);

int SlicesVerb(const SlicesFlags& f) {
  if (f.positional.size() != 1) {
    std::cerr << "tally slices: give the report folder (tally slices OUT), or a job (tally slices JOB --server ADDRESS)\n";
    return kExitUsage;
  }
  // A folder that exists is a report; anything else names a job of --server's tallyd.
  struct stat st;
  if (stat(f.positional[0].c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return SlicesOfFolder(f, f.positional[0]);
  if (f.positional[0].find('/') != std::string::npos) {
    std::cerr << "tally slices: '" << f.positional[0] << "' is not a folder (a report folder holds report.json)\n";
    return kExitFailed;
  }
  // A job of a tallyd: its report fetched into a folder of its own for the search, then removed.
  absl::StatusOr<std::unique_ptr<TallyClient>> client = Connect(f.connection);
  if (!client.ok()) return Finish(client.status());
  absl::StatusOr<std::vector<std::string>> ids = ResolveJobIds(**client, f.positional);
  if (!ids.ok()) return Finish(ids.status());
  const char* tmp = getenv("TMPDIR");
  std::string dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/tally-slices-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) return Finish(absl::UnavailableError("cannot make a temporary folder for the report"));
  absl::StatusOr<std::vector<std::string>> files = (*client)->FetchReport((*ids)[0], dir, false);
  const int rc = files.ok() ? SlicesOfFolder(f, dir) : Finish(files.status());
  RemoveTree(dir).IgnoreError();
  return rc;
}

int SlicesOfFolder(const SlicesFlags& f, const std::string& dir) {
  simdjson::dom::parser parser;
  simdjson::dom::element report;
  if (parser.load(dir + "/report.json").get(report)) {
    std::cerr << "tally slices: '" << dir << "/report.json' is missing or unreadable\n";
    return kExitFailed;
  }
  std::string manifest = f.manifest;
  std::string_view recorded;
  if (manifest.empty() && !report["source"]["manifest"].get(recorded)) manifest = std::string(recorded);
  if (manifest.empty()) {
    std::cerr << "tally slices: the job records no manifest (shards, folders, COCO): give --manifest with its columns\n";
    return kExitUsage;
  }
  bool background = false;
  if (report["include_background"].get(background)) background = false;
  std::vector<std::string> ids;
  RowCounts counts;
  absl::StatusOr<std::vector<double>> values = RowValues(dir + "/per_image.csv", f.metric, background, &ids, &counts);
  if (!values.ok()) {
    std::cerr << "tally slices: " << values.status().message() << "\n";
    return values.status().message().find("--slice-metric") == 0 ? kExitUsage : kExitFailed;
  }
  SliceOptions o;
  absl::StatusOr<std::vector<SliceAttribute>> attrs = Attributes(manifest, counts.pixels, f.bins, o.max_values);
  if (!attrs.ok()) {
    std::cerr << "tally slices: " << attrs.status().message() << "\n";
    return kExitFailed;
  }
  AddDerived(counts, f.bins, o.max_values, &*attrs);
  const SliceSearch s = FindSlices(*values, *attrs, o);
  if (f.json) {
    std::cout << Json(s, o, f.metric) << "\n";
  } else {
    PrintText(s, o, ids);
  }
  return 0;
}

}  // namespace tally
