#include <map>

#include "absl/strings/str_cat.h"
#include "common/sources/manifest.h"
#include "common/sources/row_files.h"
#include "metrics/aggregator.h"
#include "metrics/calibration.h"
#include "base/number_format.h"
#include "server/report/report_data.h"
#include "server/report/report_formats.h"

namespace tally {

std::string PerImageCsv::Header() const {
  std::string h = "index,id,image,class,tp,fp,fn,tn";
  for (Metric m : config_.metrics) absl::StrAppend(&h, ",", MetricName(m));
  // Under --nonfinite warn, rows with NaN/Inf model output are evaluated: each row says how many.
  if (config_.nonfinite == NonfinitePolicy::kWarn) h += ",nonfinite";
  // COCO instance jobs: one row per image and category, with its instances at IoU 0.5.
  if (config_.instance_job()) h += ",category,gt_instances,dt_instances,instance_tp50,instance_fp50,instance_fn50";
  // Jobs with groups or slices: the row's properties (report_groups.h), the class's own first.
  if (config_.row_properties()) h += ",fg_fraction,volume_ratio,components,pixels,mean_intensity";
  // --metrics calibration: the row's top-label ECE (15 bins) and mean confidence (metrics/calibration.h).
  if (config_.calibration) h += ",ece,confidence";
  // What the row was scored from: its files' XXH128 digests as read (docs/reports.md; `tally verify`).
  h += ",image_xxh128,mask_xxh128,prediction_xxh128";
  return h + "\n";
}

std::string PerImageCsv::Rows(const v1::ImageResult& r, const RowNames& names) const {
  const std::string prefix = absl::StrCat(r.index(), ",", CsvField(names.id), ",", CsvField(ShownImage(names)), ",");
  std::string out;
  const v1::InputDigests& in = r.inputs();
  const std::string digests = absl::StrCat(",", Hex128(in.image()), ",", Hex128(in.mask()), ",", Hex128(in.prediction()));
  std::map<int64_t, const v1::CocoImageRecord*> records;
  for (const v1::CocoImageRecord& rec : r.instances()) records[rec.category_id()] = &rec;
  for (int c = 0; c < r.classes_size(); ++c) {
    auto category = categories_.find(c);
    // Instance and panoptic jobs: classes are category ids; the ids of no category are left out.
    if ((config_.instance_job() || config_.panoptic_job()) && category == categories_.end()) continue;
    const v1::ClassResult& cr = r.classes(c);
    absl::StrAppend(&out, prefix, ClassLabel(config_, c), ",", cr.tp(), ",", cr.fp(), ",", cr.fn(), ",", cr.tn());
    for (Metric m : config_.metrics) absl::StrAppend(&out, ",", FormatDouble(Aggregator::ImageMetric(r, c, m, config_.empty_score)));
    if (config_.nonfinite == NonfinitePolicy::kWarn) absl::StrAppend(&out, ",", r.nonfinite());
    if (config_.instance_job()) {
      auto rec = records.find(c);
      const v1::CocoImageRecord empty;
      const v1::CocoImageRecord& x = rec == records.end() ? empty : *rec->second;
      absl::StrAppend(&out, ",", CsvField(category->second), ",", x.references(), ",", x.detections(), ",", x.tp50(),
                      ",", x.fp50(), ",", x.fn50());
    }
    if (config_.row_properties()) {
      const std::array<double, 3> own = ClassDerivedValues(config_, r, c);
      const DerivedValues row = RowDerivedValues(config_, r);
      absl::StrAppend(&out, ",", FormatDouble(own[0]), ",", FormatDouble(own[1]), ",", FormatDouble(own[2]), ",",
                      FormatDouble(row[3]), ",", FormatDouble(row[4]));
    }
    if (config_.calibration) {
      const bool has = r.calibration_size() == CalibrationRowSize(r.classes_size());
      absl::StrAppend(&out, ",", FormatDouble(has ? RowEce(r.calibration().data(), r.classes_size()) : NAN), ",",
                      FormatDouble(has ? RowConfidence(r.calibration().data(), r.classes_size()) : NAN));
    }
    out += digests;
    out.push_back('\n');
  }
  return out;
}

std::string LesionCsvHeader() {
  return "index,id,image,class,kind,lesion,component,voxels,volume,matched,matched_voxels,dice,hd95\n";
}

std::string LesionCsvRows(const JobConfig& config, const v1::ImageResult& r, const RowNames& names) {
  const std::string prefix = absl::StrCat(r.index(), ",", CsvField(names.id), ",", CsvField(ShownImage(names)), ",");
  std::string out;
  for (const v1::LesionRow& l : r.lesions()) {
    absl::StrAppend(&out, prefix, ClassLabel(config, l.class_index()), ",", l.kind(), ",", l.lesion(), ",",
                    l.component(), ",", l.voxels(), ",", FormatDouble(l.volume()), ",", l.matched(), ",",
                    l.matched_voxels(), ",", FormatDouble(l.dice()), ",", FormatDouble(l.hd95()), "\n");
  }
  return out;
}

}  // namespace tally
