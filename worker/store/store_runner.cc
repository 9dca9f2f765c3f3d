#include "worker/store/store_runner.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "common/security/sha256.h"
#include "base/file_util.h"
#include "common/sources/row_files.h"
#include "common/store/prediction_store.h"
#include "common/store/store_gc.h"
#include "common/store/store_keys.h"
#include "metrics/calibration.h"
#include "metrics/calibration_fine.h"
#include "metrics/label_counts.h"
#include "proto/tally.pb.h"

namespace tally {
namespace {


// fn(0 .. n-1) on up to `threads` threads (this one among them): reading, inflating and writing
// entries costs about as much a row as decoding a PNG, too much for the pipeline's one batcher or
// completion thread at thousands of rows a second.
void ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  const size_t threads = std::min<size_t>(n, std::clamp<unsigned>(std::thread::hardware_concurrency() / 4, 1, 8));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) fn(i);
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

// What one job's batches share: the store, the settings digests in use (each folder's `settings`
// file written the first time), and the accounting of --store-max-bytes.
class StoreState {
 public:
  explicit StoreState(StoreRunnerOptions options) : options_(std::move(options)), store_(options_.root) {}
  const StoreRunnerOptions& options() const { return options_; }
  const PredictionStore& store() const { return store_; }
  // The settings digest of a batch run in this layout, its JPEGs decoded on the GPU or not.
  std::string Settings(bool channels_last, bool nvjpeg);
  // After a batch's entries were written: past the bound, drops the least recently used entries.
  void Wrote(int64_t bytes);

 private:
  const StoreRunnerOptions options_;
  const PredictionStore store_;
  absl::Mutex mu_;
  std::map<int, std::string> settings_ ABSL_GUARDED_BY(mu_);  // channels_last * 2 + nvjpeg -> digest.
  int64_t estimate_ ABSL_GUARDED_BY(mu_) = -1;  // The store's bytes when last walked, plus written since.
  absl::Mutex gc_mu_;                           // One collection at a time in this worker.
};

std::string StoreState::Settings(bool channels_last, bool nvjpeg) {
  const int slot = (channels_last ? 2 : 0) + (nvjpeg ? 1 : 0);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = settings_.find(slot); it != settings_.end()) return it->second;
  }
  const std::string text = options_.settings_text(channels_last, nvjpeg);
  const std::string digest = Sha256Hex(text);
  // The folder says what made its entries (`tally rescore` finds them by it); written whole, once.
  const std::string path = SettingsFilePath(options_.root, options_.model_digest, digest);
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    absl::Status s = MakeDirs(path.substr(0, path.rfind('/')));
    if (s.ok()) s = WriteFileAtomically(path, SettingsFileText(options_.model_digest, text));
    if (!s.ok()) Log("prediction store: ", s.message());
  }
  absl::MutexLock lock(&mu_);
  settings_[slot] = digest;
  return digest;
}

void StoreState::Wrote(int64_t bytes) {
  if (options_.max_bytes <= 0 || bytes <= 0) return;
  {
    absl::MutexLock lock(&mu_);
    if (estimate_ >= 0) {
      estimate_ += bytes;
      if (estimate_ <= options_.max_bytes) return;
    }
  }
  if (!gc_mu_.TryLock()) return;
  // The store as it is (other workers write to it too), down to 90 % of the bound: the next walk
  // comes after another tenth is written.
  StoreWalk walk = WalkStore(options_.root);
  int64_t left = walk.bytes;
  if (walk.bytes > options_.max_bytes) {
    const StoreCollection c = CollectStore(std::move(walk), options_.max_bytes / 10 * 9);
    left = c.left;
    Log("prediction store: over --store-max-bytes ", options_.max_bytes, "; dropped ", c.dropped,
        " least recently used entries (", c.freed, " bytes), ", c.left, " bytes left");
  }
  {
    absl::MutexLock lock(&mu_);
    estimate_ = left;
  }
  gc_mu_.Unlock();
}

// One batch: its rows found in the store (scored here) and the rest, run by the model as a batch
// of their own (`inner`, whose item j is the batch's item misses_[j]).
class StorePendingBatch final : public PendingBatch {
 public:
  StorePendingBatch(StoreState* state, BatchSpec spec, std::vector<StoreKey> keys,
                    std::vector<std::shared_ptr<const StoredPrediction>> hits, std::vector<std::string> refused,
                    std::vector<int> misses, std::unique_ptr<PendingBatch> inner)
      : state_(state), spec_(std::move(spec)), keys_(std::move(keys)), hits_(std::move(hits)),
        refused_(std::move(refused)), misses_(std::move(misses)), inner_(std::move(inner)), slot_(spec_.items.size(), -1) {
    for (size_t j = 0; j < misses_.size(); ++j) slot_[misses_[j]] = static_cast<int>(j);
  }

  absl::Status Wait() override;
  int num_classes() const override { return k_; }
  const int64_t* confusion(int i) const override {
    return hit(i) ? counts_.data() + static_cast<size_t>(i) * k_ * k_ : inner_->confusion(slot_[i]);
  }
  const uint16_t* labels(int i) const override { return hit(i) ? hits_[i]->labels.data() : inner_->labels(slot_[i]); }
  bool CopyLabels(int i, size_t pixels, std::vector<uint16_t>* out) const override {
    if (!hit(i)) return inner_->CopyLabels(slot_[i], pixels, out);
    out->assign(hits_[i]->labels.begin(), hits_[i]->labels.begin() + std::min(pixels, hits_[i]->labels.size()));
    return true;
  }
  int64_t nonfinite(int i) const override { return hit(i) ? hits_[i]->nonfinite : inner_->nonfinite(slot_[i]); }
  int64_t logit_ties() const override { return inner_ ? inner_->logit_ties() : 0; }
  std::string error(int i) const override { return hit(i) ? errors_[i] : inner_->error(slot_[i]); }
  const double* surface(int i) const override { return hit(i) ? nullptr : inner_->surface(slot_[i]); }
  const int64_t* threshold_counts(int i) const override {
    if (!hit(i)) return inner_->threshold_counts(slot_[i]);
    return thresholds_.empty() ? nullptr : thresholds_.data() + static_cast<size_t>(i) * 4 * state_->options().thresholds.size();
  }
  const int64_t* calibration(int i) const override {
    if (!hit(i)) return inner_->calibration(slot_[i]);
    return calibration_.empty() ? nullptr : calibration_.data() + static_cast<size_t>(i) * CalibrationRowSize(k_);
  }
  const int64_t* calibration_fine() const override { return fine_.empty() ? nullptr : fine_.data(); }
  const uint16_t* scores(int i) const override {
    if (!hit(i)) return inner_->scores(slot_[i]);
    return hits_[i]->scores.empty() ? nullptr : hits_[i]->scores.data();
  }
  const std::vector<CocoInstance>* instances(int i) const override {
    return hit(i) ? nullptr : inner_->instances(slot_[i]);
  }
  bool from_store(int i) const override { return hit(i); }

 private:
  bool hit(int i) const { return slot_[i] < 0; }
  void Store();  // The model's rows into the store.
  // --metrics calibration: row i found in the store, counted from its kept scores (v / 65535 class
  // 1's probability, as the model's rows are at the store's precision) into calibration_ and fine_.
  std::string CountCalibrationOf(size_t i, const uint16_t* mask);

  StoreState* state_;
  BatchSpec spec_;
  std::vector<StoreKey> keys_;
  std::vector<std::shared_ptr<const StoredPrediction>> hits_;  // Per item; null for the model's rows.
  std::vector<std::string> refused_;  // Per item: why a held row cannot be scored (empty: it can).
  std::vector<int> misses_;
  std::unique_ptr<PendingBatch> inner_;
  std::vector<int> slot_;  // Item -> its index in inner_'s batch, or -1 (from the store).
  int k_ = 0;
  std::vector<int64_t> counts_;
  std::vector<int64_t> thresholds_;  // Per item: tp, fp, fn, tn at each threshold (the store's rows).
  std::vector<std::string> errors_;
  std::vector<int64_t> calibration_;  // Per item: CalibrationRowSize(k_) values (the store's rows).
  absl::Mutex fine_mu_;
  std::vector<int64_t> fine_;  // The batch's fine histogram: the model's rows' and the store's.
};

std::string StorePendingBatch::CountCalibrationOf(size_t i, const uint16_t* mask) {
  const StoredPrediction& p = *hits_[i];
  if (p.scores.empty() || k_ != 2) {
    return "--metrics calibration needs the model's probabilities, and the prediction store's entry of this row keeps "
           "labels only (the model gave several score channels or labels)";
  }
  if (p.scores.size() != p.labels.size()) {
    return absl::StrCat("the prediction store's entry of this row has ", p.scores.size(), " scores for ", p.labels.size(),
                        " labels");
  }
  std::vector<float> one(p.scores.size());
  for (size_t x = 0; x < one.size(); ++x) one[x] = ScoreProbability(p.scores[x]);
  std::vector<int64_t> fine(static_cast<size_t>(CalibrationFineSize(2)), 0);
  CountTwoClassCalibration(one.data(), mask, p.labels.data(), static_cast<int64_t>(one.size()),
                           calibration_.data() + i * CalibrationRowSize(2), fine.data());
  // The row's few occupied bins, found outside the lock: the rows counted beside it wait only for
  // those to be added, not for a pass over every bin.
  v1::CalibrationFine cells;
  SetSparseFine(fine.data(), 2, &cells);
  absl::MutexLock lock(&fine_mu_);
  AddSparseFine(cells, &fine_);
  return "";
}

absl::Status StorePendingBatch::Wait() {
  if (inner_) RETURN_IF_ERROR(inner_->Wait());
  k_ = inner_ ? inner_->num_classes() : 0;
  for (const auto& h : hits_) {
    if (h && k_ == 0) k_ = h->classes;  // A rescore's batch: the entries say.
  }
  const size_t n = spec_.items.size();
  counts_.assign(n * k_ * k_, 0);
  const std::vector<double>& ts = state_->options().thresholds;
  thresholds_.assign(n * 4 * ts.size(), 0);
  errors_.assign(n, "");
  const bool calibration = state_->options().calibration && k_ > 0;
  if (calibration) {
    calibration_.assign(n * CalibrationRowSize(k_), 0);
    const int64_t* model_fine = inner_ ? inner_->calibration_fine() : nullptr;
    if (model_fine != nullptr) {
      fine_.assign(model_fine, model_fine + CalibrationFineSize(k_));
    } else {
      fine_.assign(static_cast<size_t>(CalibrationFineSize(k_)), 0);
    }
  }
  ParallelFor(n, [&](size_t i) {
    if (!hits_[i]) return;
    if (!refused_[i].empty()) {
      errors_[i] = refused_[i];
      return;
    }
    if (hits_[i]->classes != k_) {
      errors_[i] = absl::StrCat("the prediction store's entry has ", hits_[i]->classes, " classes, the model ", k_);
      return;
    }
    const BatchImage& it = spec_.items[i];
    const uint16_t* mask = reinterpret_cast<const uint16_t*>(spec_.masks->data()) + it.mask_offset;
    CountConfusionMatrix(hits_[i]->labels.data(), mask, hits_[i]->labels.size(), k_, counts_.data() + i * k_ * k_);
    if (calibration) {
      errors_[i] = CountCalibrationOf(i, mask);
      if (!errors_[i].empty()) return;
    }
    if (ts.empty()) return;
    if (hits_[i]->scores.empty()) {
      errors_[i] = "--thresholds needs the model's scores, and the prediction store's entry of this row keeps labels only "
                   "(the model gave several score channels or labels)";
      return;
    }
    CountStoredThresholds(hits_[i]->scores.data(), mask, hits_[i]->scores.size(), ts, thresholds_.data() + i * 4 * ts.size());
  });
  if (inner_) Store();
  return absl::OkStatus();
}

void StorePendingBatch::Store() {
  static std::atomic<bool> warned{false};
  std::atomic<int64_t> written{0};
  // Written before the batch's rows are delivered: a job that ends has left every entry.
  ParallelFor(misses_.size(), [&](size_t j) {
    const int i = misses_[j];
    const BatchImage& it = spec_.items[i];
    const uint16_t* labels = inner_->labels(static_cast<int>(j));
    if (keys_[i].input.empty() || labels == nullptr || !inner_->error(static_cast<int>(j)).empty() ||
        inner_->instances(static_cast<int>(j)) != nullptr || k_ < 2) {
      return;
    }
    StoredPrediction p;
    p.height = it.height;
    p.width = it.width;
    p.classes = k_;
    p.nonfinite = inner_->nonfinite(static_cast<int>(j));
    p.labels.assign(labels, labels + static_cast<size_t>(it.height) * it.width);
    if (const uint16_t* scores = inner_->scores(static_cast<int>(j)); scores != nullptr) {
      p.scores.assign(scores, scores + p.labels.size());
    }
    int64_t bytes = 0;
    if (absl::Status s = state_->store().Write(keys_[i], p, &bytes); !s.ok() && !warned.exchange(true)) {
      Log("prediction store: ", s.message(), " (rows are scored all the same; logged once)");
    }
    written += bytes;
  });
  state_->Wrote(written.load());
}

// A rescore's runner: no model; each row it is given is one the store did not have.
class NoModelBatch final : public PendingBatch {
 public:
  explicit NoModelBatch(const std::string* reason) : reason_(reason) {}
  absl::Status Wait() override { return absl::OkStatus(); }
  int num_classes() const override { return 0; }
  const int64_t* confusion(int /*i*/) const override { return nullptr; }
  const uint16_t* labels(int /*i*/) const override { return nullptr; }
  bool CopyLabels(int /*i*/, size_t /*pixels*/, std::vector<uint16_t>* /*out*/) const override { return false; }
  int64_t nonfinite(int /*i*/) const override { return 0; }
  int64_t logit_ties() const override { return 0; }
  std::string error(int /*i*/) const override { return *reason_; }

 private:
  const std::string* reason_;
};

class VectorHostBuffer final : public HostBuffer {
 public:
  explicit VectorHostBuffer(size_t bytes) : bytes_(bytes) {}
  uint8_t* data() override { return bytes_.data(); }
  size_t size() const override { return bytes_.size(); }

 private:
  std::vector<uint8_t> bytes_;
};

class NoModel final : public ModelRunner {
 public:
  explicit NoModel(std::string reason) : reason_(std::move(reason)) {}
  std::unique_ptr<HostBuffer> AllocateHost(size_t bytes) override { return std::make_unique<VectorHostBuffer>(bytes); }
  absl::StatusOr<std::unique_ptr<PendingBatch>> Launch(const BatchSpec& /*batch*/) override {
    return std::unique_ptr<PendingBatch>(new NoModelBatch(&reason_));
  }
  void ReleaseCachedMemory() override {}
  absl::StatusOr<int> FindMaxBatch(int, int, double, int, int fallback) override { return fallback; }
  absl::StatusOr<VolumePrediction> PredictVolume(const VolumeRequest& /*request*/) override {
    return absl::NotFoundError(reason_);
  }
  RunnerStats Stats() override { return RunnerStats(); }
  bool is_cuda() const override { return false; }

 private:
  const std::string reason_;
};

// A row's entry, found before its image was decoded, and the settings it was found under.
struct HeldEntry final : HeldPrediction {
  std::shared_ptr<const StoredPrediction> prediction;
  std::string settings;
};

class StoreRunner final : public ModelRunner {
 public:
  StoreRunner(ModelRunner* inner, StoreRunnerOptions options) : inner_(inner), state_(std::move(options)) {}

  absl::StatusOr<std::unique_ptr<PendingBatch>> Launch(const BatchSpec& batch) override;
  std::shared_ptr<const HeldPrediction> FindHeld(const v1::ManifestRow& row, const std::string& image_digest) override;
  absl::StatusOr<VolumePrediction> PredictVolume(const VolumeRequest& request) override;

  std::unique_ptr<HostBuffer> AllocateHost(size_t bytes) override { return inner_->AllocateHost(bytes); }
  void ReleaseCachedMemory() override { inner_->ReleaseCachedMemory(); }
  void ResetPeakMemory() override { inner_->ResetPeakMemory(); }
  absl::StatusOr<int> FindMaxBatch(int height, int width, double max_memory, int limit, int fallback) override {
    return inner_->FindMaxBatch(height, width, max_memory, limit, fallback);
  }
  RunnerStats Stats() override { return inner_->Stats(); }
  bool is_cuda() const override { return inner_->is_cuda(); }
  int64_t MeasureHostBytes(const BatchSpec& batch) override { return inner_->MeasureHostBytes(batch); }
  bool ScoresSurfaceOnDevice() const override { return inner_->ScoresSurfaceOnDevice(); }
  std::string TrialLayout(const BatchSpec& batch, std::string* trial) override { return inner_->TrialLayout(batch, trial); }
  void SetChannelsLast(bool on) override {
    inner_->SetChannelsLast(on);
    layout_agreed_ = true;
  }
  void SetCompileResolver(CompileResolver resolver) override { inner_->SetCompileResolver(std::move(resolver)); }
  bool ChannelsLast() const override { return inner_->ChannelsLast(); }
  bool PrepareLayoutTrial(const BatchSpec& batch) override { return inner_->PrepareLayoutTrial(batch); }
  std::string SkipLayoutTrial(int64_t rows, double first_batch_seconds) override {
    return inner_->SkipLayoutTrial(rows, first_batch_seconds);
  }
  bool StartLayoutTrial(std::function<void()> on_ready) override { return inner_->StartLayoutTrial(std::move(on_ready)); }
  std::string FinishLayoutTrial(std::string* trial) override { return inner_->FinishLayoutTrial(trial); }
  void CancelLayoutTrial() override { inner_->CancelLayoutTrial(); }

 private:
  std::atomic<bool> layout_agreed_{false};
  // The input's digest ("" where the bytes are not known: never stored): of the image's bytes, and
  // for Python models of the row's other columns too (`values`, in the manifest's order).
  std::string InputDigest(const std::string* image_digest, const v1::ManifestRow* row) const;
  std::string InputDigestOf(const std::string* image_digest, const std::vector<std::string>& values) const;
  // The settings a row of a batch in this layout may be stored under, tried in order: the runner's
  // (a row is written under it), or a rescore's list.
  std::vector<std::string> SettingsList(bool nvjpeg);

  ModelRunner* inner_;
  StoreState state_;
};

std::string StoreRunner::InputDigest(const std::string* image_digest, const v1::ManifestRow* row) const {
  std::vector<std::string> values;
  for (int c = 0; row != nullptr && c < row->columns_size(); ++c) values.push_back(row->columns(c));
  return InputDigestOf(image_digest, values);
}

std::string StoreRunner::InputDigestOf(const std::string* image_digest, const std::vector<std::string>& values) const {
  if (image_digest == nullptr || image_digest->size() != 16) return "";
  const StoreRunnerOptions& o = state_.options();
  if (!o.columns_are_input) return Hex128(*image_digest);
  std::string columns = Hex128(*image_digest);
  for (size_t c = 0; c < values.size() && c < o.columns.size(); ++c) {
    absl::StrAppend(&columns, "\n", o.columns[c], "=", values[c]);
  }
  return Sha256Hex(columns).substr(0, 32);
}

absl::StatusOr<VolumePrediction> StoreRunner::PredictVolume(const VolumeRequest& r) {
  const StoreRunnerOptions& o = state_.options();
  std::vector<std::string> values;  // The manifest's columns come first in the request's row.
  for (size_t c = 0; c < r.row.size() && c < o.columns.size(); ++c) values.push_back(r.row[c].second);
  const std::string input = InputDigestOf(&r.input_digest, values);
  const std::vector<std::string> settings = input.empty() ? std::vector<std::string>() : SettingsList(false);
  const int64_t voxels = r.depth * r.height * r.width;
  for (const std::string& s : settings) {
    absl::StatusOr<StoredPrediction> p = state_.store().Read(StoreKey{o.model_digest, s, input}, static_cast<int>(r.height),
                                                             static_cast<int>(r.width), static_cast<int>(r.depth));
    if (p.ok()) {
      VolumePrediction v;
      v.labels = std::move(p->labels);
      v.classes = p->classes;
      v.nonfinite = p->nonfinite;
      v.from_store = true;
      return v;
    }
    if (p.status().code() == absl::StatusCode::kDataLoss) {
      Log("prediction store: ", p.status().message(), "; the volume is predicted again");
    }
  }
  ASSIGN_OR_RETURN(VolumePrediction v, inner_->PredictVolume(r));
  // Kept where the entry can say it exactly: a known class count, every label below it.
  if (settings.empty() || v.classes < 2 || static_cast<int64_t>(v.labels.size()) != voxels ||
      *std::max_element(v.labels.begin(), v.labels.end()) >= v.classes) {
    return v;
  }
  StoredPrediction p;
  p.depth = static_cast<int>(r.depth);
  p.height = static_cast<int>(r.height);
  p.width = static_cast<int>(r.width);
  p.classes = v.classes;
  p.nonfinite = v.nonfinite;
  p.labels = v.labels;
  int64_t bytes = 0;
  if (absl::Status s = state_.store().Write(StoreKey{o.model_digest, settings.front(), input}, p, &bytes); !s.ok()) {
    Log("prediction store: ", s.message(), " (the volume is scored all the same)");
  }
  state_.Wrote(bytes);
  return v;
}

std::vector<std::string> StoreRunner::SettingsList(bool nvjpeg) {
  const StoreRunnerOptions& o = state_.options();
  if (!o.settings_text) return o.rescore_settings;
  return {state_.Settings(inner_->ChannelsLast(), nvjpeg)};
}

std::shared_ptr<const HeldPrediction> StoreRunner::FindHeld(const v1::ManifestRow& row, const std::string& image_digest) {
  const StoreRunnerOptions& o = state_.options();
  if (!o.find_before_decoding || (o.once_layout_agreed && !layout_agreed_)) return nullptr;
  const std::string input = InputDigest(&image_digest, &row);
  if (input.empty()) return nullptr;
  for (const std::string& s : SettingsList(false)) {  // Rows decoded on the host.
    const StoreKey key{o.model_digest, s, input};
    absl::StatusOr<StoreEntryInfo> info = ReadStoreEntryHeader(state_.store().EntryPath(key));
    if (!info.ok()) continue;  // None (or not an entry: the batch's lookup reads it again and says so).
    absl::StatusOr<StoredPrediction> p = state_.store().Read(key, info->height, info->width);
    if (!p.ok() || (o.calibration && o.settings_text && p->scores.empty())) continue;
    auto held = std::make_shared<HeldEntry>();
    held->height = p->height;
    held->width = p->width;
    held->prediction = std::make_shared<const StoredPrediction>(*std::move(p));
    held->settings = s;
    return held;
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<PendingBatch>> StoreRunner::Launch(const BatchSpec& batch) {
  const size_t n = batch.items.size();
  const StoreRunnerOptions& o = state_.options();
  const std::vector<std::string> settings = SettingsList(batch.decoded_on_gpu);
  std::vector<StoreKey> keys(n);
  std::vector<std::shared_ptr<const StoredPrediction>> hits(n);
  std::vector<std::string> refused(n);
  ParallelFor(n, [&](size_t i) {
    const BatchImage& it = batch.items[i];
    if (it.held != nullptr) {  // Found before decoding: its pixels were never filled.
      const auto* held = static_cast<const HeldEntry*>(it.held);
      hits[i] = held->prediction;
      if (std::find(settings.begin(), settings.end(), held->settings) == settings.end()) {
        refused[i] = "the row's stored prediction was made with other settings than its batch ran with (the job's "
                     "layout or JPEG decoder changed while it ran); run the job again";
      }
      return;
    }
    const std::string input = InputDigest(it.image_digest, it.row);
    if (input.empty() || settings.empty()) return;
    keys[i] = StoreKey{o.model_digest, settings.front(), input};
    for (const std::string& s : settings) {
      absl::StatusOr<StoredPrediction> p = state_.store().Read(StoreKey{o.model_digest, s, input}, it.height, it.width);
      if (p.ok() && o.calibration && o.settings_text && p->scores.empty()) return;  // Labels only: the model again.
      if (p.ok()) {
        hits[i] = std::make_shared<const StoredPrediction>(*std::move(p));
        return;
      }
      if (p.status().code() == absl::StatusCode::kDataLoss) {
        Log("prediction store: ", p.status().message(), "; the row is predicted again");
      }
    }
  });
  std::vector<int> misses;
  for (size_t i = 0; i < n; ++i) {
    if (!hits[i]) misses.push_back(static_cast<int>(i));
  }
  std::unique_ptr<PendingBatch> inner;
  if (!misses.empty()) {
    BatchSpec sub = batch;
    sub.items.clear();
    for (int i : misses) sub.items.push_back(batch.items[i]);
    // On a GPU the kernels (and the last bits of every row's output) may change with the batch's
    // size: the model's rows run as a batch of the full size, padded with copies of its last row,
    // whose outputs are not used, so they come out as in a run without the store.
    if (inner_->is_cuda()) {
      sub.calibration_items = static_cast<int>(sub.items.size());  // The copies count in no histogram.
      while (sub.items.size() < n) sub.items.push_back(sub.items.back());
    }
    sub.want_labels = true;  // Back to the host, for the store.
    sub.want_scores = true;
    sub.keep_labels = false;
    ASSIGN_OR_RETURN(inner, inner_->Launch(sub));
  }
  return std::unique_ptr<PendingBatch>(new StorePendingBatch(&state_, batch, std::move(keys), std::move(hits),
                                                             std::move(refused), std::move(misses), std::move(inner)));
}

}  // namespace

std::unique_ptr<ModelRunner> NoModelRunner(std::string reason) { return std::make_unique<NoModel>(std::move(reason)); }

std::unique_ptr<ModelRunner> WrapWithStore(ModelRunner* inner, StoreRunnerOptions options) {
  return std::make_unique<StoreRunner>(inner, std::move(options));
}

}  // namespace tally
