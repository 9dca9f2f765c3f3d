#include "server/report/compare.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/file_util.h"
#include "common/job/job_config.h"
#include "common/sources/manifest.h"
#include "base/status_macros.h"
#include "metrics/aggregator.h"
#include "metrics/statistics.h"
#include "base/json_writer.h"
#include "base/number_format.h"
#include "server/report/report_groups.h"
#include "server/report/report_table.h"

namespace tally {
namespace {


struct Evaluated {
  v1::ImageResult result;
  std::string id;
  std::vector<std::string> columns;  // Failed rows' too (groups).
};

absl::StatusOr<std::vector<Evaluated>> ReadJob(JobStore* store, const JobRecord& r, std::vector<std::string>* ids) {
  std::vector<Evaluated> out(static_cast<size_t>(r.job.images_total()));
  ids->assign(out.size(), "");
  RETURN_IF_ERROR(store->ForEachResult(r.job.job_id(), [&](const v1::ImageResult& res, const RowNames& names) {
    if (res.index() < 0 || res.index() >= static_cast<int64_t>(out.size())) return absl::OkStatus();
    (*ids)[res.index()] = names.id;
    if (res.error().empty()) out[res.index()] = {res, names.id, {}};
    out[res.index()].columns = names.columns;
    return absl::OkStatus();
  }));
  return out;
}

std::string Cell(double v) { return FormatCell(v); }

// Two jobs can be compared: the same manifest's rows and classes, and ids that pair rows.
absl::Status CheckComparable(const JobRecord& a, const JobRecord& b) {
  if (a.job.images_total() != b.job.images_total()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot compare ", a.job.job_id(), " (", a.job.images_total(),
                                                   " rows) with ", b.job.job_id(), " (", b.job.images_total(),
                                                   " rows): compare two runs of the same manifest"));
  }
  if (a.job.num_classes() != b.job.num_classes()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot compare ", a.job.job_id(), " (", a.job.num_classes(),
                                                   " classes) with ", b.job.job_id(), " (", b.job.num_classes(), ")"));
  }
  for (const JobRecord* r : {&a, &b}) {
    if (r->job.spec().duplicate_id_rows() > 0) {
      return absl::InvalidArgumentError(absl::StrCat("cannot compare ", r->job.job_id(), ": its manifest repeats ids, ",
                                                     "and a comparison pairs images by id: ",
                                                     absl::StrJoin(r->job.spec().manifest_warnings(), "; ")));
    }
  }
  return absl::OkStatus();
}

// Per class and metric: the paired values in index order, each run's own defined values and those
// defined in one run only; per class the images whose Dice changed.
struct Own {
  double sum_a = 0, sum_b = 0;
  int64_t n_a = 0, n_b = 0, only_a = 0, only_b = 0;
};
struct Tallies {
  Tallies(int classes, size_t metrics)
      : pairs(classes, std::vector<std::vector<std::pair<double, double>>>(metrics)),
        changed(classes),
        own(classes, std::vector<Own>(metrics)) {}
  std::vector<std::vector<std::vector<std::pair<double, double>>>> pairs;
  std::vector<std::vector<ChangedImage>> changed;
  std::vector<std::vector<Own>> own;
};

void TallyRow(const Evaluated& ra, const Evaluated& rb, int64_t i, const JobConfig& ca, const JobConfig& cb,
              int classes, Comparison* c, Tallies* t) {
  const bool has_a = ra.result.classes_size() > 0, has_b = rb.result.classes_size() > 0;
  for (int k = 0; k < classes; ++k) {
    for (size_t m = 0; m < c->metrics.size(); ++m) {
      const double va = has_a ? Aggregator::ImageMetric(ra.result, k, c->metrics[m], ca.empty_score) : NAN;
      const double vb = has_b ? Aggregator::ImageMetric(rb.result, k, c->metrics[m], cb.empty_score) : NAN;
      Own& o = t->own[k][m];
      if (std::isfinite(va)) o.sum_a += va, ++o.n_a;
      if (std::isfinite(vb)) o.sum_b += vb, ++o.n_b;
      if (has_a && has_b && std::isfinite(va) != std::isfinite(vb)) ++(std::isfinite(va) ? o.only_a : o.only_b);
    }
  }
  if (has_a != has_b) {
    ++(has_a ? c->only_a : c->only_b);
    return;
  }
  if (!has_a) return;
  ++c->paired;
  for (int k = 0; k < classes; ++k) {
    Comparison::Row row{i, ra.id, k, {}, {}};
    for (size_t m = 0; m < c->metrics.size(); ++m) {
      const double va = Aggregator::ImageMetric(ra.result, k, c->metrics[m], ca.empty_score);
      const double vb = Aggregator::ImageMetric(rb.result, k, c->metrics[m], cb.empty_score);
      row.a.push_back(va);
      row.b.push_back(vb);
      if (std::isfinite(va) && std::isfinite(vb)) t->pairs[k][m].emplace_back(va, vb);
      if (c->metrics[m] == Metric::kDice && std::isfinite(va) && std::isfinite(vb) && va != vb) {
        t->changed[k].push_back({i, ra.id, va, vb});
      }
    }
    c->rows.push_back(std::move(row));
  }
}

void SummariseClasses(int classes, Tallies* t, Comparison* c) {
  for (int k = 0; k < classes; ++k) {
    ClassComparison cc;
    cc.class_id = k;
    for (size_t m = 0; m < c->metrics.size(); ++m) {
      MetricComparison mc;
      mc.metric = c->metrics[m];
      static_cast<PairedSummary&>(mc) =
          SummarisePairs(t->pairs[k][m], IsCountMetric(c->metrics[m]) || c->metrics[m] == Metric::kNsd);
      const Own& o = t->own[k][m];
      mc.defined_only_a = o.only_a;
      mc.defined_only_b = o.only_b;
      mc.own_images_a = o.n_a;
      mc.own_images_b = o.n_b;
      mc.own_mean_a = o.n_a > 0 ? o.sum_a / static_cast<double>(o.n_a) : NAN;
      mc.own_mean_b = o.n_b > 0 ? o.sum_b / static_cast<double>(o.n_b) : NAN;
      cc.metrics.push_back(mc);
    }
    std::vector<ChangedImage>& changed = t->changed[k];
    std::stable_sort(changed.begin(), changed.end(), [](const ChangedImage& x, const ChangedImage& y) {
      return std::fabs(x.dice_b - x.dice_a) > std::fabs(y.dice_b - y.dice_a);
    });
    if (changed.size() > 10) changed.resize(10);
    cc.most_changed = std::move(changed);
    c->classes.push_back(std::move(cc));
  }
}

// A's rows as GroupKeys reads them.
class EvaluatedRows : public GroupedRows {
 public:
  EvaluatedRows(const JobConfig& config, const std::vector<Evaluated>& rows) : rows_(rows) {
    derived_.resize(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      derived_[i].fill(NAN);
      if (!failed(i)) derived_[i] = RowDerivedValues(config, rows[i].result);
    }
  }
  size_t size() const override { return rows_.size(); }
  bool failed(size_t row) const override { return rows_[row].result.classes_size() == 0; }
  const std::string& column(size_t row, size_t col) const override {
    return col < rows_[row].columns.size() ? rows_[row].columns[col] : none_;
  }
  double derived(size_t row, int slot) const override { return derived_[row][slot]; }
  const std::string& tag(size_t row, int t) const override {
    const auto& tags = rows_[row].result.properties().tags();
    return t < tags.size() ? tags.Get(t) : none_;
  }

 private:
  const std::vector<Evaluated>& rows_;
  std::vector<DerivedValues> derived_;
  const std::string none_;
};

// Per group of each of A's --group-by terms: the paired summaries of the group's rows.
void GroupPairs(const JobConfig& ca, const std::vector<Evaluated>& ra, int classes, Comparison* c) {
  const EvaluatedRows rows(ca, ra);
  const size_t metrics = c->metrics.size();
  for (const GroupBy& g : ca.group_by) {
    const std::vector<std::string> keys = GroupKeys(g, ca, rows);
    std::map<std::string, std::vector<std::vector<std::vector<std::pair<double, double>>>>> pairs;
    std::map<std::string, std::set<int64_t>> members;
    for (const Comparison::Row& r : c->rows) {
      auto& p = pairs[keys[r.index]];
      if (p.empty()) p.assign(classes, std::vector<std::vector<std::pair<double, double>>>(metrics));
      members[keys[r.index]].insert(r.index);
      for (size_t m = 0; m < metrics; ++m) {
        if (std::isfinite(r.a[m]) && std::isfinite(r.b[m])) p[r.class_id][m].emplace_back(r.a[m], r.b[m]);
      }
    }
    Comparison::GroupTable table;
    table.by = g.text;
    for (auto& [value, p] : pairs) {
      Comparison::GroupEntry e;
      e.value = value;
      e.pairs = static_cast<int64_t>(members[value].size());
      for (int k = 0; k < classes; ++k) {
        if (k == 0 && !ca.include_background && ca.regions.empty()) continue;
        ClassComparison cc;
        cc.class_id = k;
        for (size_t m = 0; m < metrics; ++m) {
          MetricComparison mc;
          mc.metric = c->metrics[m];
          static_cast<PairedSummary&>(mc) = SummarisePairs(p[k][m], IsCountMetric(mc.metric) || mc.metric == Metric::kNsd);
          cc.metrics.push_back(mc);
        }
        e.classes.push_back(std::move(cc));
      }
      table.groups.push_back(std::move(e));
    }
    std::stable_sort(table.groups.begin(), table.groups.end(),
                     [](const Comparison::GroupEntry& x, const Comparison::GroupEntry& y) { return GroupBefore(x.value, y.value); });
    c->groups.push_back(std::move(table));
  }
}

}  // namespace

absl::StatusOr<Comparison> CompareJobs(JobStore* store, const JobRecord& a, const JobRecord& b) {
  Comparison c;
  c.a = a;
  c.b = b;
  RETURN_IF_ERROR(CheckComparable(a, b));
  ASSIGN_OR_RETURN(const JobConfig ca, JobConfigFromSpec(a.job.spec()));
  ASSIGN_OR_RETURN(const JobConfig cb, JobConfigFromSpec(b.job.spec()));
  for (Metric m : ca.metrics) {
    if (std::find(cb.metrics.begin(), cb.metrics.end(), m) != cb.metrics.end()) c.metrics.push_back(m);
  }
  std::vector<std::string> ids_a, ids_b;
  ASSIGN_OR_RETURN(std::vector<Evaluated> ra, ReadJob(store, a, &ids_a));
  ASSIGN_OR_RETURN(std::vector<Evaluated> rb, ReadJob(store, b, &ids_b));
  for (size_t i = 0; i < ids_a.size(); ++i) {
    if (ids_a[i] != ids_b[i]) {
      return absl::InvalidArgumentError(absl::StrCat("cannot compare: row ", i, " is '", ids_a[i], "' in ",
                                                     a.job.job_id(), " but '", ids_b[i], "' in ", b.job.job_id(),
                                                     "; compare two runs of the same manifest"));
    }
  }
  const int classes = a.job.num_classes();
  Tallies tallies(classes, c.metrics.size());
  for (size_t i = 0; i < ra.size(); ++i) {
    TallyRow(ra[i], rb[i], static_cast<int64_t>(i), ca, cb, classes, &c, &tallies);
  }
  SummariseClasses(classes, &tallies, &c);
  GroupPairs(ca, ra, classes, &c);
  return c;
}

namespace {

Table SummaryTable(const Comparison& c) {
  Table t;
  t.header = {"class", "metric", "pairs", "A", "B", "B - A", "95% CI", "Wilcoxon p", "B higher", "B lower",
              "defined in A only", "defined in B only", "A (own)", "B (own)"};
  t.left = {true, true};
  for (const ClassComparison& cc : c.classes) {
    for (const MetricComparison& mc : cc.metrics) {
      t.rows.push_back({{absl::StrCat(cc.class_id)}, {std::string(MetricName(mc.metric))}, {absl::StrCat(mc.pairs)},
                        {Cell(mc.mean_a)}, {Cell(mc.mean_b)}, {Cell(mc.mean_diff)},
                        {absl::StrCat("[", Cell(mc.ci_low), ", ", Cell(mc.ci_high), "]")},
                        {absl::StrFormat("%.3g", mc.wilcoxon_p)}, {absl::StrCat(mc.higher)}, {absl::StrCat(mc.lower)},
                        {absl::StrCat(mc.defined_only_a)}, {absl::StrCat(mc.defined_only_b)},
                        {absl::StrCat(Cell(mc.own_mean_a), " (", mc.own_images_a, ")")},
                        {absl::StrCat(Cell(mc.own_mean_b), " (", mc.own_images_b, ")")}});
    }
  }
  return t;
}

Table ChangedTable(const ClassComparison& cc) {
  Table t;
  t.header = {"index", "id", "Dice A", "Dice B", "B - A"};
  t.left = {false, true};
  for (const ChangedImage& x : cc.most_changed) {
    t.rows.push_back({{absl::StrCat(x.index)}, {x.id, true}, {Cell(x.dice_a)}, {Cell(x.dice_b)},
                      {Cell(x.dice_b - x.dice_a)}});
  }
  return t;
}

Table GroupCompareTable(const Comparison::GroupTable& g) {
  Table t;
  t.header = {g.by, "pairs", "class", "metric", "A", "B", "B - A", "95% CI", "Wilcoxon p"};
  t.left = {true, false, true, true};
  for (const Comparison::GroupEntry& e : g.groups) {
    for (const ClassComparison& cc : e.classes) {
      for (const MetricComparison& mc : cc.metrics) {
        t.rows.push_back({{e.value}, {absl::StrCat(mc.pairs)}, {absl::StrCat(cc.class_id)}, {std::string(MetricName(mc.metric))},
                          {Cell(mc.mean_a)}, {Cell(mc.mean_b)}, {Cell(mc.mean_diff)},
                          {absl::StrCat("[", Cell(mc.ci_low), ", ", Cell(mc.ci_high), "]")},
                          {absl::StrFormat("%.3g", mc.wilcoxon_p)}});
      }
    }
  }
  return t;
}

void GroupsJson(const Comparison& c, JsonWriter& w) {
  if (c.groups.empty()) return;
  w.Key("groups").BeginArray();
  for (const Comparison::GroupTable& g : c.groups) {
    w.BeginObject().Field("by", g.by).Key("groups").BeginArray();
    for (const Comparison::GroupEntry& e : g.groups) {
      w.BeginObject().Field("value", e.value).Field("paired_images", e.pairs).Key("classes").BeginArray();
      for (const ClassComparison& cc : e.classes) {
        w.BeginObject().Field("class", cc.class_id);
        for (const MetricComparison& mc : cc.metrics) {
          w.Key(std::string(MetricName(mc.metric))).BeginObject().Field("pairs", mc.pairs).Field("mean_a", mc.mean_a);
          w.Field("mean_b", mc.mean_b).Field("mean_diff", mc.mean_diff);
          w.Key("diff_ci95").BeginArray().Number(mc.ci_low).Number(mc.ci_high).EndArray();
          w.Field("wilcoxon_p", mc.wilcoxon_p).EndObject();
        }
        w.EndObject();
      }
      w.EndArray().EndObject();
    }
    w.EndArray().EndObject();
  }
  w.EndArray();
}

std::string Json(const Comparison& c) {
  JsonWriter w;
  w.BeginObject();
  w.Field("a", c.a.job.job_id()).Field("b", c.b.job.job_id());
  w.Field("a_model", c.a.job.spec().model()).Field("b_model", c.b.job.spec().model());
  w.Field("manifest", c.a.job.spec().manifest());
  w.Field("paired_images", c.paired).Field("only_a", c.only_a).Field("only_b", c.only_b);
  w.Key("classes").BeginArray();
  for (const ClassComparison& cc : c.classes) {
    w.BeginObject().Field("class", cc.class_id);
    for (const MetricComparison& mc : cc.metrics) {
      const std::string m(MetricName(mc.metric));
      w.Key(m).BeginObject();
      w.Field("pairs", mc.pairs).Field("mean_a", mc.mean_a).Field("mean_b", mc.mean_b).Field("mean_diff", mc.mean_diff);
      w.Key("diff_ci95").BeginArray().Number(mc.ci_low).Number(mc.ci_high).EndArray();
      w.Field("wilcoxon_p", mc.wilcoxon_p).Field("b_higher", mc.higher).Field("b_lower", mc.lower);
      w.Field("defined_only_a", mc.defined_only_a).Field("defined_only_b", mc.defined_only_b);
      w.Field("own_mean_a", mc.own_mean_a).Field("own_images_a", mc.own_images_a);
      w.Field("own_mean_b", mc.own_mean_b).Field("own_images_b", mc.own_images_b);
      w.EndObject();
    }
    w.Key("most_changed").BeginArray();
    for (const ChangedImage& x : cc.most_changed) {
      w.BeginObject().Field("index", x.index).Field("id", x.id).Field("dice_a", x.dice_a).Field("dice_b", x.dice_b);
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
  GroupsJson(c, w);
  w.EndObject();
  return w.str() + "\n";
}

std::string Csv(const Comparison& c) {
  std::string out = "index,id,class";
  for (Metric m : c.metrics) absl::StrAppend(&out, ",", MetricName(m), "_a,", MetricName(m), "_b");
  out += "\n";
  for (const Comparison::Row& r : c.rows) {
    absl::StrAppend(&out, r.index, ",", CsvField(r.id), ",", r.class_id);
    for (size_t m = 0; m < r.a.size(); ++m) absl::StrAppend(&out, ",", FormatDouble(r.a[m]), ",", FormatDouble(r.b[m]));
    out += "\n";
  }
  return out;
}

std::string Header(const Comparison& c) {
  return absl::StrCat("A: ", c.a.job.job_id(), " (", c.a.job.spec().model(), ")\nB: ", c.b.job.job_id(), " (",
                      c.b.job.spec().model(), ")\n", c.paired, " images evaluated in both runs, ", c.only_a,
                      " only in A, ", c.only_b, " only in B.");
}

std::string Markdown(const Comparison& c) {
  std::string out = "# Tally comparison\n\n";
  for (absl::string_view line : absl::StrSplit(Header(c), '\n')) absl::StrAppend(&out, "- ", line, "\n");
  out += "\nPer class and metric, over the images with a finite value in both runs: the means, the mean paired "
         "difference B - A with its 95% interval (a betting interval, valid at any number of images, for metrics "
         "in [0, 1]; none for surface distances, which are unbounded), and the Wilcoxon signed-rank p-value. The "
         "images whose value is defined in one run only (Dice 0 in one, undefined where the other predicts nothing "
         "and the reference has none) are left out of the pairs and counted per run; each run's own mean (over "
         "every image it evaluated with a finite value, as its report has it) follows, with its images.\n\n";
  out += MarkdownTable(SummaryTable(c));
  for (const ClassComparison& cc : c.classes) {
    if (cc.most_changed.empty()) continue;
    absl::StrAppend(&out, "\n## Class ", cc.class_id, ": images whose Dice changed most\n\n", MarkdownTable(ChangedTable(cc)));
  }
  for (const Comparison::GroupTable& g : c.groups) {
    absl::StrAppend(&out, "\n## Paired by ", g.by, " (A's groups)\n\n", MarkdownTable(GroupCompareTable(g)));
  }
  return out;
}

std::string Html(const Comparison& c) {
  std::string h = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Tally comparison</title>"
                  "<style>body{font-family:sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse}"
                  "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td.l,th.l{text-align:left}</style>"
                  "</head><body>\n<h1>Tally comparison</h1>\n<p>";
  for (absl::string_view line : absl::StrSplit(Header(c), '\n')) absl::StrAppend(&h, HtmlEscape(std::string(line)), "<br>");
  h += "</p>\n" + HtmlTable(SummaryTable(c));
  for (const ClassComparison& cc : c.classes) {
    if (cc.most_changed.empty()) continue;
    absl::StrAppend(&h, "<h2>Class ", cc.class_id, ": images whose Dice changed most</h2>\n", HtmlTable(ChangedTable(cc)));
  }
  for (const Comparison::GroupTable& g : c.groups) {
    absl::StrAppend(&h, "<h2>Paired by ", HtmlEscape(g.by), " (A's groups)</h2>\n", HtmlTable(GroupCompareTable(g)));
  }
  return h + "</body></html>\n";
}

}  // namespace

absl::Status WriteComparison(const Comparison& c, const std::string& dir) {
  RETURN_IF_ERROR(MakeDirs(dir));
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/compare.json", Json(c)));
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/compare.csv", Csv(c)));
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/compare.md", Markdown(c)));
  return WriteFileAtomically(dir + "/compare.html", Html(c));
}

}  // namespace tally
