// The groups and failing slices (report_groups.h) in each report format: report.json's "groups" and
// "slices", groups.csv, and one table per --group-by term (and the slices' table) in summary.md and
// report.html, built once as a Table (report_table.h).
#include <cmath>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/json_writer.h"
#include "base/number_format.h"
#include "common/sources/csv.h"
#include "metrics/catalogue.h"
#include "server/report/report_formats.h"
#include "server/report/report_table.h"

namespace tally {
namespace {

std::string Interval(double mean, double lo, double hi) {
  if (std::isnan(lo)) return FormatCell(mean);
  return absl::StrCat(FormatCell(mean), " [", FormatCell(lo), ", ", FormatCell(hi), "]");
}

std::string Signed(double v) { return std::isfinite(v) && v > 0 ? "+" + FormatCell(v) : FormatCell(v); }

std::string RowName(const ReportData& d, int64_t index) {
  const std::string id = d.WorstId(index);
  return id.empty() ? absl::StrCat(index) : absl::StrCat(index, " (", id, ")");
}

}  // namespace

void GroupsJson(const ReportData& d, JsonWriter& w) {
  const GroupsReport& g = d.groups;
  if (!g.tables.empty()) {
    w.Key("groups").BeginObject().Field("min_group_rows", g.min_group_rows).Key("tables").BeginArray();
    for (const GroupTable& t : g.tables) {
      w.BeginObject().Field("by", t.by).Key("groups").BeginArray();
      for (const Group& x : t.groups) {
        w.BeginObject().Field("value", x.value).Field("rows", x.rows).Field("failed_rows", x.failed).Field("small", x.small);
        w.Key("classes").BeginArray();
        for (const GroupClass& c : x.classes) {
          w.BeginObject().Field("class", ClassLabel(d.config, c.class_id));
          for (size_t m = 0; m < g.metrics.size(); ++m) {
            const GroupStats& s = c.metrics[m];
            w.Key(std::string(MetricName(g.metrics[m]))).BeginObject().Field("n", s.n).Field("mean", s.mean);
            w.Key("ci95").BeginArray().Number(s.lo).Number(s.hi).EndArray();
            w.Field("diff", s.diff).Key("diff_ci95").BeginArray().Number(s.diff_lo).Number(s.diff_hi).EndArray();
            w.EndObject();
          }
          w.EndObject();
        }
        w.EndArray().EndObject();
      }
      w.EndArray().EndObject();
    }
    w.EndArray().EndObject();
  }
  if (!g.slices.has_value()) return;
  const SliceSearch& s = *g.slices;
  w.Key("slices").BeginObject().Field("metric", "dice").Field("rows", s.rows).Field("candidates", s.candidates);
  w.Field("tested", s.tested).Field("significant", s.significant).Field("q", g.slice_options.q);
  w.Field("min_rows", g.slice_options.min_rows).Key("attributes").BeginArray();
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
}

std::string GroupsCsv(const ReportData& d) {
  const GroupsReport& g = d.groups;
  std::string out = "by,group,rows,failed_rows,small,class,metric,n,mean,ci95_low,ci95_high,diff,diff_ci95_low,diff_ci95_high\n";
  for (const GroupTable& t : g.tables) {
    for (const Group& x : t.groups) {
      for (const GroupClass& c : x.classes) {
        for (size_t m = 0; m < g.metrics.size(); ++m) {
          const GroupStats& s = c.metrics[m];
          absl::StrAppend(&out, CsvField(t.by), ",", CsvField(x.value), ",", x.rows, ",", x.failed, ",",
                          x.small ? "true" : "false", ",", ClassLabel(d.config, c.class_id), ",", MetricName(g.metrics[m]),
                          ",", s.n, ",", FormatDouble(s.mean), ",", FormatDouble(s.lo), ",", FormatDouble(s.hi), ",",
                          FormatDouble(s.diff), ",", FormatDouble(s.diff_lo), ",", FormatDouble(s.diff_hi), "\n");
        }
      }
    }
  }
  return out;
}

Table GroupTableOf(const ReportData& d, const GroupTable& t) {
  const GroupsReport& g = d.groups;
  Table table;
  table.header = {t.by, "rows", "failed", "class"};
  table.left = {true, false, false, true};
  for (Metric m : g.metrics) {
    table.header.push_back(absl::StrCat(MetricName(m), " [95% CI]"));
    table.header.push_back(absl::StrCat("vs rest [95% CI]"));
    table.left.insert(table.left.end(), {false, false});
  }
  for (const Group& x : t.groups) {
    for (const GroupClass& c : x.classes) {
      std::vector<TableCell> row = {{x.small ? x.value + " (small)" : x.value},
                                    {absl::StrCat(x.rows)},
                                    {absl::StrCat(x.failed)},
                                    {d.ClassName(c.class_id)}};
      for (const GroupStats& s : c.metrics) {
        row.push_back({Interval(s.mean, s.lo, s.hi)});
        row.push_back({std::isnan(s.diff_lo) ? Signed(s.diff)
                                             : absl::StrCat(Signed(s.diff), " [", Signed(s.diff_lo), ", ", Signed(s.diff_hi), "]")});
      }
      table.rows.push_back(std::move(row));
    }
  }
  return table;
}

Table SliceTable(const ReportData& d) {
  const GroupsReport& g = d.groups;
  Table table;
  table.header = {"slice", "rows", "mean Dice inside [95% CI]", "outside [95% CI]", "effect [95% CI]", "test",
                  "adjusted p", "worst rows"};
  table.left = {true, false, false, false, false, true, false, true};
  for (const Slice& x : g.slices->slices) {
    std::string worst;
    for (int64_t r : x.worst_rows) absl::StrAppend(&worst, worst.empty() ? "" : ", ", RowName(d, r));
    table.rows.push_back({{x.name},
                          {absl::StrCat(x.rows)},
                          {Interval(x.mean_inside, x.inside_lo, x.inside_hi)},
                          {Interval(x.mean_outside, x.outside_lo, x.outside_hi)},
                          {absl::StrCat(Signed(x.effect), " [", Signed(x.effect_lo), ", ", Signed(x.effect_hi), "]")},
                          {x.test},
                          {absl::StrFormat("%.3g", x.p_adjusted)},
                          {worst}});
  }
  return table;
}

std::string SliceSentence(const ReportData& d) {
  const SliceSearch& s = *d.groups.slices;
  return absl::StrFormat(
      "%d rows (mean foreground Dice per row); %d attributes; %d candidate slices, %d tested (at least %d rows); "
      "Benjamini-Hochberg at q = %g over the %d tested: %d significant, %d shown (the others folded into them).",
      s.rows, s.attributes.size(), s.candidates, s.tested, d.groups.slice_options.min_rows, d.groups.slice_options.q,
      s.tested, s.significant, s.slices.size());
}

std::string GroupsMarkdown(const ReportData& d) {
  std::string out;
  for (const GroupTable& t : d.groups.tables) {
    absl::StrAppend(&out, "\n## Groups by ", t.by, "\n\nMeans with 95% t intervals; \"vs rest\": the group's mean minus ",
                    "the other rows', Welch's 95% interval. Groups under ", d.groups.min_group_rows,
                    " rows are marked (small).\n\n", MarkdownTable(GroupTableOf(d, t)));
  }
  if (d.groups.slices.has_value()) {
    absl::StrAppend(&out, "\n## Failing slices\n\n", SliceSentence(d), "\n\n");
    if (!d.groups.slices->slices.empty()) out += MarkdownTable(SliceTable(d));
  }
  return out;
}

// Each slice's worst rows that have a thumbnail (of the first foreground class that has one).
std::string SliceThumbnails(const ReportData& d) {
  std::string h;
  for (const Slice& x : d.groups.slices->slices) {
    std::string figures;
    for (int64_t index : x.worst_rows) {
      for (const ClassAggregate& ca : d.aggregate.classes) {
        const StoredThumbnail* t = d.IsForeground(ca.class_id) ? d.Thumbnail(ca.class_id, index) : nullptr;
        if (t == nullptr) continue;
        absl::StrAppend(&figures, "<figure data-index=\"", index, "\"><img src=\"data:image/jpeg;base64,",
                        absl::Base64Escape(t->jpeg), "\" alt=\"", HtmlEscape(RowName(d, index)),
                        "\"><figcaption><code>", HtmlEscape(RowName(d, index)), "</code> · class ",
                        HtmlEscape(d.ClassName(ca.class_id)), " · Dice ", FormatCell(t->dice), "</figcaption></figure>\n");
        break;
      }
    }
    if (!figures.empty()) {
      absl::StrAppend(&h, "<p>", HtmlEscape(x.name), ": its worst rows</p>\n<div class=\"thumbs\">\n", figures, "</div>\n");
    }
  }
  return h;
}

std::string GroupsHtml(const ReportData& d) {
  std::string out;
  for (const GroupTable& t : d.groups.tables) {
    absl::StrAppend(&out, "<h2>Groups by ", HtmlEscape(t.by), "</h2>\n<p>Means with 95% t intervals; &ldquo;vs rest&rdquo;: ",
                    "the group's mean minus the other rows', Welch's 95% interval. Groups under ", d.groups.min_group_rows,
                    " rows are marked (small).</p>\n<div class=\"table-wrap\">", HtmlTable(GroupTableOf(d, t)), "</div>\n");
  }
  if (d.groups.slices.has_value()) {
    absl::StrAppend(&out, "<h2>Failing slices</h2>\n<p>", HtmlEscape(SliceSentence(d)), "</p>\n");
    if (!d.groups.slices->slices.empty()) out += "<div class=\"table-wrap\">" + HtmlTable(SliceTable(d)) + "</div>\n";
    out += SliceThumbnails(d);
  }
  return out;
}

}  // namespace tally
