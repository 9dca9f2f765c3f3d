#include "server/report/report_data.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/status_macros.h"
#include "common/coco/coco_instances.h"

namespace tally {

std::string ClassLabel(const JobConfig& config, int class_id) {
  if (config.regions.empty() || class_id < 0 || class_id >= static_cast<int>(config.regions.size())) {
    return absl::StrCat(class_id);
  }
  return absl::StrJoin(config.regions[class_id], "+");
}

namespace {
// Classes a result lacks (a prediction job gives each image the classes up to its own largest
// label) are absent from its prediction and reference alike: no tp, fp or fn, every valid pixel a
// true negative, surface distances of two empty masks (NaN).
void PadClasses(v1::ImageResult* r, int num_classes) {
  if (!r->error().empty() || r->classes_size() >= num_classes || r->classes_size() == 0) return;
  const v1::ClassResult& first = r->classes(0);
  const int64_t valid = first.tp() + first.fp() + first.fn() + first.tn();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  while (r->classes_size() < num_classes) {
    v1::ClassResult* c = r->add_classes();
    c->set_tn(valid);
    c->set_hd(nan);
    c->set_hd95(nan);
    c->set_assd(nan);
    c->set_nsd(nan);
  }
}
}  // namespace

std::string ReportData::WorstImage(int64_t index) const {
  auto it = worst_rows.find(index);
  return it == worst_rows.end() ? "" : it->second.image;
}

std::string ReportData::WorstId(int64_t index) const {
  auto it = worst_rows.find(index);
  return it == worst_rows.end() ? "" : it->second.id;
}

int64_t ReportData::DiceZeroImages(const ClassAggregate& ca) { return ca.dice_zero_images; }

std::string ReportData::DiceTieNote(const ClassAggregate& ca) {
  const int64_t zeros = DiceZeroImages(ca);
  if (zeros <= static_cast<int64_t>(ca.worst.size())) return "";
  return absl::StrCat(zeros, " images tie at Dice 0; the ", ca.worst.size(), " listed are the first of them by index");
}

std::string FailureKind(const std::string& reason) {
  // A quote opens at an apostrophe that starts a word and closes at one that ends a word, so that
  // "sample's" stays text and 'o'brien.png' stays one file name.
  auto word = [&](size_t i) {
    return i < reason.size() && (absl::ascii_isalnum(static_cast<unsigned char>(reason[i])) ||
                                 static_cast<unsigned char>(reason[i]) >= 0x80);
  };
  std::string out;
  bool quoted = false;
  for (size_t i = 0; i < reason.size(); ++i) {
    const char c = reason[i];
    if (c == '\'') {
      if (!quoted && !(i > 0 && word(i - 1))) {
        out += "'\xE2\x80\xA6'";
        quoted = true;
        continue;
      }
      if (quoted && !word(i + 1)) {
        quoted = false;
        continue;
      }
    }
    if (quoted) continue;
    if (c >= '0' && c <= '9') {
      if (out.empty() || out.back() != '#') out.push_back('#');
      continue;
    }
    out.push_back(c);
  }
  return out;
}

namespace {

// A finished --until-ci job's note from the report's intervals: the widest foreground Dice
// half-width, its class and the rows, reached or not (docs/metrics.md "Answers before the end").
std::string UntilCiNote(const ReportData& d) {
  const v1::Job& job = d.record->job;
  const double width = job.spec().until_ci();
  if (width <= 0 || job.state() != v1::JOB_STATE_SUCCEEDED) return "";
  double widest = -1;
  int widest_class = -1;
  for (const ClassAggregate& ca : d.aggregate.classes) {
    if (!ca.in_foreground_mean) continue;
    const double half = (ca.dice_ci_high - ca.dice_ci_low) / 2;
    if (std::isnan(half)) {
      widest = std::numeric_limits<double>::quiet_NaN();
      widest_class = ca.class_id;
      break;
    }
    if (half > widest) widest = half, widest_class = ca.class_id;
  }
  const std::string figure =
      widest_class < 0 ? std::string("no foreground class")
      : std::isnan(widest)
          ? absl::StrCat("no interval for ", d.ClassName(widest_class))
          : absl::StrCat("widest foreground Dice half-width ", absl::StrFormat("%.4g", widest), " (",
                         d.config.regions.empty() ? "class " : "region ", d.ClassName(widest_class), ")");
  const int64_t rows = d.evaluated + d.failed;
  if (!job.sampled().empty()) {
    return absl::StrCat("--until-ci ", width, " reached: ", figure, " after ", rows, " rows, as the table shows");
  }
  // Every row in: the manifest's means are exact, and the table's intervals are of the mean over the
  // images the rows are drawn from (IntervalKind::kRows), which the note quotes.
  return absl::StrCat("--until-ci ", width, " not reached: every row was evaluated first; ", figure, " over all ", rows,
                      " rows, as the table shows (the interval of the mean over the images these rows are drawn from)");
}

// The warnings that catch wrong numbers (docs/reports.md "Warnings"), and the failed rows grouped by reason.
void AddWarnings(ReportData* d) {
  // What the coordinator noticed about the manifest at submission (duplicate ids) and about the
  // workers while the job ran (one refusing it: another copy of the model).
  for (const std::string& w : d->record->job.spec().manifest_warnings()) d->warnings.push_back(w);
  for (const std::string& w : d->record->job.spec().run_warnings()) d->warnings.push_back(w);
  std::map<std::string, size_t> group_of;
  for (const Failure& f : d->failures) {
    const std::string kind = FailureKind(f.reason);
    auto [it, added] = group_of.emplace(kind, d->failure_groups.size());
    if (added) d->failure_groups.push_back({kind, 0, f.reason});
    ++d->failure_groups[it->second].count;
  }
  std::stable_sort(d->failure_groups.begin(), d->failure_groups.end(),
                   [](const FailureGroup& a, const FailureGroup& b) { return a.count > b.count; });
  const bool classes = d->config.regions.empty();
  const std::string what = classes ? "class " : "region ";
  if (d->evaluated > 0) {
    for (const ClassAggregate& ca : d->aggregate.classes) {
      if (!d->IsForeground(ca.class_id) || !d->IsCategoryClass(ca.class_id)) continue;
      const std::string name = what + d->ClassName(ca.class_id);
      if (ca.reference_images == 0 && ca.predicted_images > 0) {
        d->warnings.push_back(absl::StrCat(name, " is in no reference mask, but the model predicts it in ",
                                           ca.predicted_images, " of ", d->evaluated,
                                           " images; it is left out of the foreground means (a model for another "
                                           "label set, or the wrong --num-classes?)"));
      } else if (ca.reference_images == 0) {
        d->warnings.push_back(absl::StrCat(name, " is in no reference mask and never predicted; it is left out of the "
                                           "foreground means"));
      } else if (ca.predicted_images == 0) {
        d->warnings.push_back(absl::StrCat("the model never predicts ", name, ", which is in ", ca.reference_images,
                                           " reference masks"));
      }
    }
    if (classes && !d->config.predictions() && d->mask_max_label >= 0 && d->mask_max_label + 1 < d->num_classes) {
      d->warnings.push_back(absl::StrCat("the model has ", d->num_classes, " classes, but the reference masks hold labels ",
                                         "0..", d->mask_max_label, " only"));
    }
  }
  d->until_ci_note = UntilCiNote(*d);
  if (d->until_ci_note.empty()) d->until_ci_note = d->record->job.until_ci_note();  // Not finished: the live note.
  if (!d->window_unused.empty()) {
    int64_t rows = 0;
    std::vector<std::string> formats;
    for (const auto& [format, n] : d->window_unused) {
      rows += n;
      formats.push_back(absl::StrCat(format, " (", n, ")"));
    }
    const v1::JobSpec& spec = d->record->job.spec();
    d->warnings.push_back(absl::StrCat("--window ", spec.window_center(), ",", spec.window_width(),
                                       " applies to 16-bit TIFF and grey DICOM images only: ", rows,
                                       " evaluated row(s) were read without it, their images being ",
                                       absl::StrJoin(formats, ", ")));
  }
  if (d->inputs_modified > 0) {
    d->warnings.push_back(absl::StrCat(
        d->inputs_modified, " evaluated row(s) were read from files modified after the job was submitted (the first: ",
        "row ", d->inputs_modified_first, " '", d->inputs_modified_first_id, "', modified ",
        absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixNanos(d->inputs_modified_first_ns), absl::UTCTimeZone()),
        "): rows read before and after a change saw different data. per_image.csv's *_xxh128 columns say which ",
        "bytes each row was scored from; tally verify names the files that differ now"));
  }
  const int64_t total = d->record->job.images_total();
  if (d->config.TooManyFailed(d->failed, total)) {
    d->warnings.push_back(absl::StrFormat(
        "%d of %d rows failed (%.1f%%), more than --max-failed-fraction %g allows; most often: %s (%d row%s)",
        d->failed, total, 100.0 * static_cast<double>(d->failed) / static_cast<double>(std::max<int64_t>(1, total)),
        d->config.max_failed_fraction, d->failure_groups.front().kind, d->failure_groups.front().count,
        d->failure_groups.front().count == 1 ? "" : "s"));
  }
}

AggregateOptions AggregateOptionsFor(const ReportData& d, std::optional<IntervalKind> interval = {}) {
  AggregateOptions o;
  o.num_classes = d.num_classes;
  o.metrics = d.config.metrics;
  o.include_background = d.config.include_background || !d.config.regions.empty();
  o.empty_score = d.config.empty_score;
  o.iou_thresholds = d.config.iou_thresholds;
  o.thresholds = d.config.thresholds;
  o.interval = interval.has_value() ? *interval : IntervalKindFor(*d.record);
  o.population_rows = static_cast<double>(d.record->job.images_total());
  return o;
}

// The names of the rows the report lists by index (worst rows), read back from the parts' manifests.
absl::Status NameRows(JobStore* store, const std::vector<const JobRecord*>& parts, const std::set<int64_t>& indices,
                      ReportData* d) {
  int64_t offset = 0;
  for (const JobRecord* part : parts) {
    const int64_t end = offset + part->job.images_total();
    std::vector<int64_t> local;
    for (auto it = indices.lower_bound(offset); it != indices.end() && *it < end; ++it) local.push_back(*it - offset);
    if (!local.empty()) {
      ASSIGN_OR_RETURN(std::vector<ManifestRow> rows, store->ReadRowsAt(part->job.job_id(), local));
      for (const ManifestRow& r : rows) d->worst_rows[r.index + offset] = ReportData::WorstRow{r.id, ShownImage(NamesOf(r))};
    }
    offset = end;
  }
  return absl::OkStatus();
}

// The worst rows' names, and the thumbnails kept for the first --thumbnails of each list (a merge's
// parts each kept theirs: only as many as one job shows are shown).
absl::Status AttachWorstRows(JobStore* store, const std::vector<const JobRecord*>& parts, ReportData* d) {
  std::set<std::pair<int, int64_t>> worst;
  std::set<int64_t> indices;
  const size_t shown = static_cast<size_t>(std::max(0, d->config.thumbnails));
  for (size_t i = 0; i < d->instances.worst.size(); ++i) {
    if (i < shown) worst.insert({kInstanceThumbnailClass, d->instances.worst[i].index});
    indices.insert(d->instances.worst[i].index);
  }
  for (const ClassAggregate& ca : d->aggregate.classes) {
    size_t i = 0;
    for (const auto& [dice, index] : ca.worst) {
      if (i++ < shown) worst.insert({ca.class_id, index});
      indices.insert(index);
    }
  }
  // The failing slices' worst rows, wherever a worker rendered one of them (report_groups.h).
  if (d->groups.slices.has_value()) {
    for (const Slice& s : d->groups.slices->slices) {
      for (int64_t index : s.worst_rows) {
        indices.insert(index);  // Named as the worst lists' rows are.
        for (const ClassAggregate& ca : d->aggregate.classes) {
          if (d->IsForeground(ca.class_id)) worst.insert({ca.class_id, index});
        }
      }
    }
  }
  RETURN_IF_ERROR(NameRows(store, parts, indices, d));
  int64_t offset = 0;
  for (const JobRecord* part : parts) {
    ASSIGN_OR_RETURN(std::vector<StoredThumbnail> thumbnails, store->ReadThumbnails(part->job.job_id()));
    for (StoredThumbnail& t : thumbnails) {
      t.index += offset;
      if (worst.count({t.class_index, t.index}) > 0) d->thumbnails[{t.class_index, t.index}] = std::move(t);
    }
    offset += part->job.images_total();
  }
  return absl::OkStatus();
}

}  // namespace

IntervalKind IntervalKindFor(const JobRecord& record) {
  const v1::Job& job = record.job;
  // Every row accounted for (a finished job, a merge): the rows stand for the images they are drawn
  // from. Fewer: a random-order job's rows so far, or a sample, are a random sample of the manifest;
  // a manifest-order job's are its first rows, which no random process chose.
  if (job.sampled().empty() && job.images_evaluated() + job.images_failed() >= job.images_total()) {
    return IntervalKind::kRows;
  }
  return job.spec().random_order() ? IntervalKind::kSample : IntervalKind::kNone;
}

std::string IntervalMethod(IntervalKind kind) {
  switch (kind) {
    case IntervalKind::kRows:
      return "betting interval (Waudby-Smith & Ramdas 2023) of the mean over the images these rows are drawn from; "
             "valid at any number of rows for values in [0, 1]";
    case IntervalKind::kSample:
      return "betting interval (Waudby-Smith & Ramdas 2023) of the manifest's mean from a uniform random sample "
             "without replacement (finite-population corrected); valid at any number of rows for values in [0, 1]";
    case IntervalKind::kNone:
      break;
  }
  return "none: the rows evaluated so far are the manifest's first ones, not a random sample (--order random "
         "gives one)";
}

ReportAccumulator::ReportAccumulator(const JobRecord& record, JobConfig config, std::optional<IntervalKind> interval)
    : config_(std::move(config)) {
  d_.record = &record;
  d_.config = config_;
  d_.num_classes = record.job.num_classes();
  const AggregateOptions options = AggregateOptionsFor(d_, interval);
  d_.interval = options.interval;
  aggregator_ = std::make_unique<Aggregator>(options);
  // A sample's interval reads the rows in the order they were drawn.
  if (options.interval == IntervalKind::kSample) {
    order_ = RowOrder(record.job.images_total(), record.job.spec().random_order(), record.job.spec().order_seed());
  }
  if (record.job.created_unix() > 0) submitted_ns_ = static_cast<int64_t>(record.job.created_unix() * 1e9);
  d_.record = nullptr;  // Set again by Finish (the record may move meanwhile).
  // These keep a reference to the configuration: config_, which stays where it is.
  if (config_.instance_job()) instances_ = std::make_unique<InstanceAccumulator>(config_);
  if (config_.panoptic_job()) panoptic_ = std::make_unique<PanopticAccumulator>(config_);
  if (config_.row_properties()) groups_ = std::make_unique<GroupAccumulator>(config_);
}

ReportAccumulator::~ReportAccumulator() = default;

absl::StatusOr<std::unique_ptr<ReportAccumulator>> ReportAccumulator::Create(const JobRecord& record,
                                                                          std::optional<IntervalKind> interval) {
  ASSIGN_OR_RETURN(JobConfig config, JobConfigFromSpec(record.job.spec()));
  return std::make_unique<ReportAccumulator>(record, std::move(config), interval);
}

void ReportAccumulator::AddRow(const v1::ImageResult& original, const RowNames& names, int64_t offset,
                               const ReportRowFn& on_row) {
  v1::ImageResult shifted;
  const v1::ImageResult* sp = &original;
  if (offset > 0) {
    shifted = original;
    shifted.set_index(original.index() + offset);
    sp = &shifted;
  }
  const v1::ImageResult& stored = *sp;
  const std::string& image = ShownImage(names);
  if (!stored.error().empty()) {
    d_.failures.push_back({stored.index(), names.id, image, stored.error()});
    ++d_.failed;
    if (groups_ != nullptr) groups_->Add(stored.index(), nullptr, names);
    return;
  }
  v1::ImageResult padded;
  const v1::ImageResult* rp = &stored;
  if (stored.classes_size() < d_.num_classes) {
    padded = stored;
    PadClasses(&padded, d_.num_classes);
    rp = &padded;
  }
  const v1::ImageResult& r = *rp;
  ++d_.evaluated;
  if (r.from_store()) ++d_.from_store;
  // A second of slack for the clocks of the file server and tallyd's host.
  if (submitted_ns_ > 0 && r.inputs().modified_ns() > submitted_ns_ + 1'000'000'000) {
    ++d_.inputs_modified;
    if (d_.inputs_modified_first < 0 || r.index() < d_.inputs_modified_first) {
      d_.inputs_modified_first = r.index();
      d_.inputs_modified_first_id = names.id;
      d_.inputs_modified_first_ns = r.inputs().modified_ns();
    }
  }
  if (!r.inputs().window_unused().empty()) ++d_.window_unused[r.inputs().window_unused()];
  if (r.nonfinite() > 0) {
    ++d_.nonfinite_images;
    d_.nonfinite_values += r.nonfinite();
  }
  d_.mask_max_label = std::max(d_.mask_max_label, r.mask_max_label());
  d_.mask_ignored += r.mask_ignored_pixels();
  if (r.spacing_size() == 3) ++d_.spacings[{r.spacing(0), r.spacing(1), r.spacing(2)}];
  // The interval's order: a sample's draw order, else the row's id (its image's name where the
  // manifest has none), so that `tally merge` of any split of a manifest gives the whole job's.
  aggregator_->Add(r, order_.has_value() ? static_cast<uint64_t>(order_->PositionOf(r.index()))
                                         : RowKey(names.id.empty() ? image : names.id));
  if (instances_ != nullptr) instances_->Add(r);
  if (panoptic_ != nullptr) panoptic_->Add(r);
  if (groups_ != nullptr) groups_->Add(r.index(), &r, names);
  if (r.calibration_size() > 0 || r.has_calibration_fine()) AddCalibration(stored);
  if (on_row) on_row(r, names);
}

void ReportAccumulator::AddCalibration(const v1::ImageResult& r) {
  const int k = r.classes_size();
  if (r.calibration_size() > 0) {
    if (d_.calibration.AddRow(r.calibration().data(), r.calibration_size(), k)) {
      ++d_.calibration_rows;
    } else {
      ++d_.calibration_mismatched;
    }
  }
  if (!r.has_calibration_fine()) return;
  const v1::CalibrationFine& f = r.calibration_fine();
  if (f.classes() != d_.calibration.classes() || f.cells_size() != f.pixels_size() || f.cells_size() != f.correct_size()) {
    return;  // Not counted: fine_rows falls short of rows, and the report says the equal-mass figures are out.
  }
  for (int i = 0; i < f.cells_size(); ++i) {
    d_.calibration.AddFine(f.cells(i) / kCalibrationFineBins, f.cells(i) % kCalibrationFineBins, f.pixels(i), f.correct(i));
  }
  d_.calibration_fine_rows += f.covers_size();
}

void ReportAccumulator::Merge(ReportAccumulator* other) {
  aggregator_->Merge(*other->aggregator_);
  d_.failures.insert(d_.failures.end(), other->d_.failures.begin(), other->d_.failures.end());
  d_.failed += other->d_.failed;
  d_.evaluated += other->d_.evaluated;
  d_.from_store += other->d_.from_store;
  d_.nonfinite_images += other->d_.nonfinite_images;
  d_.nonfinite_values += other->d_.nonfinite_values;
  d_.inputs_modified += other->d_.inputs_modified;
  for (const auto& [format, rows] : other->d_.window_unused) d_.window_unused[format] += rows;
  if (other->d_.inputs_modified_first >= 0 &&
      (d_.inputs_modified_first < 0 || other->d_.inputs_modified_first < d_.inputs_modified_first)) {
    d_.inputs_modified_first = other->d_.inputs_modified_first;
    d_.inputs_modified_first_id = other->d_.inputs_modified_first_id;
    d_.inputs_modified_first_ns = other->d_.inputs_modified_first_ns;
  }
  d_.mask_max_label = std::max(d_.mask_max_label, other->d_.mask_max_label);
  d_.mask_ignored += other->d_.mask_ignored;
  d_.calibration.Merge(other->d_.calibration);
  d_.calibration_rows += other->d_.calibration_rows;
  d_.calibration_fine_rows += other->d_.calibration_fine_rows;
  d_.calibration_mismatched += other->d_.calibration_mismatched;
  for (const auto& [spacing, rows] : other->d_.spacings) d_.spacings[spacing] += rows;
  if (instances_ != nullptr && other->instances_ != nullptr) instances_->Merge(other->instances_.get());
  if (groups_ != nullptr && other->groups_ != nullptr) groups_->Merge(other->groups_.get());
}

absl::StatusOr<ReportData> ReportAccumulator::Finish(JobStore* store, const std::vector<const JobRecord*>& parts,
                                                     const JobRecord& record) {
  ReportData d = std::move(d_);
  d_ = ReportData();
  d.record = &record;
  // The job's settings as they are now (workers' resolved choices are written into the spec while
  // rows arrive); what the rows were aggregated with (metrics, classes) does not change.
  ASSIGN_OR_RETURN(d.config, JobConfigFromSpec(record.job.spec()));
  std::sort(d.failures.begin(), d.failures.end(),
            [](const Failure& a, const Failure& b) { return a.index < b.index; });
  d.aggregate = aggregator_->Finish();
  if (panoptic_ != nullptr) d.panoptic = panoptic_->Finish();
  if (instances_ != nullptr) d.instances = instances_->Finish();
  if (groups_ != nullptr) d.groups = groups_->Finish();
  if (!d.calibration.empty()) {
    // The equal-mass figures only from a fine histogram of every row counted (always, in a job that
    // ended with every row: tallyd counts a batch's histogram with all its rows or refuses them).
    const bool whole = d.calibration_fine_rows == d.calibration_rows;
    d.calibration_summary = SummarizeCalibration(d.calibration, whole);
    if (!whole) {
      d.warnings.push_back(absl::StrCat("calibration: the fine histogram covers ", d.calibration_fine_rows, " of the ",
                                        d.calibration_rows, " rows counted; the equal-mass figures are left out"));
    }
  }
  if (d.config.calibration && d.evaluated > d.calibration_rows + d.calibration_mismatched) {
    d.warnings.push_back(absl::StrCat("calibration: ", d.evaluated - d.calibration_rows - d.calibration_mismatched,
                                      " evaluated rows carry no probabilities (volumes are not counted) and are "
                                      "left out of the calibration figures"));
  }
  if (d.calibration_mismatched > 0) {
    d.warnings.push_back(absl::StrCat("calibration: ", d.calibration_mismatched,
                                      " rows' calibration values did not match the job's class count and were left out"));
  }
  RETURN_IF_ERROR(AttachWorstRows(store, parts, &d));
  for (const JobRecord* part : parts) {
    ASSIGN_OR_RETURN(std::vector<WorkerRecord> workers, store->ReadWorkers(part->job.job_id()));
    d.workers.insert(d.workers.end(), workers.begin(), workers.end());
  }
  const double end_unix = record.last_result_unix > 0 ? record.last_result_unix : record.job.finished_unix();
  d.end_unix = end_unix;
  d.wall_seconds = std::max(0.0, end_unix - record.job.created_unix());
  if (d.evaluated > 0 && d.mask_max_label <= 0 && d.mask_ignored > 0) {
    // A binary mask stored as 0/255 with 255 the ignore value: its whole foreground is ignored.
    d.warnings.push_back(absl::StrCat(
        "every reference mask holds only 0 and the ignore value ", d.config.ignore_index, " (", d.mask_ignored,
        " pixels ignored): if ", d.config.ignore_index, " marks the foreground, pass --label-map 0:0,",
        d.config.ignore_index, ":1 (or --ignore-index none)"));
  }
  AddWarnings(&d);
  return d;
}

absl::StatusOr<ReportData> GatherReportData(JobStore* store, const JobRecord& record, const ReportRowFn& on_row) {
  return GatherMergedReportData(store, {&record}, record, on_row);
}

absl::StatusOr<ReportData> GatherMergedReportData(JobStore* store, const std::vector<const JobRecord*>& parts,
                                                  const JobRecord& record, const ReportRowFn& on_row) {
  ASSIGN_OR_RETURN(std::unique_ptr<ReportAccumulator> acc, ReportAccumulator::Create(record));
  int64_t offset = 0;  // Index of the part's first row in the merged order.
  for (const JobRecord* part : parts) {
    RETURN_IF_ERROR(store->ForEachResult(part->job.job_id(), [&](const v1::ImageResult& r, const RowNames& names) {
      acc->AddRow(r, names, offset, on_row);
      return absl::OkStatus();
    }));
    offset += part->job.images_total();
  }
  return acc->Finish(store, parts, record);
}

}  // namespace tally
