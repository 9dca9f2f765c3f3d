#include "worker/store/store_runner.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "common/security/sha256.h"
#include "common/store/prediction_store.h"
#include "common/sources/row_files.h"
#include "metrics/label_counts.h"
#include "proto/tally.pb.h"

namespace tally {
namespace {

constexpr int kMaxDigestedFiles = 100000;  // Files of one --model-option folder that are digested.

// Adds a file's, or a folder's files' (sorted, recursively), digests and names to `text`.
absl::Status DigestPath(const std::string& path, int* files, std::string* text) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return absl::OkStatus();  // Not a path: the option's value alone.
  if (S_ISREG(st.st_mode)) {
    if (++*files > kMaxDigestedFiles) {
      return absl::ResourceExhaustedError(absl::StrCat("--prediction-store: more than ", kMaxDigestedFiles,
                                                       " files under a --model-option path to digest"));
    }
    ASSIGN_OR_RETURN(FileFacts f, DigestFile(path));
    absl::StrAppend(text, path, "=", Hex128(f.xxh128), "\n");
    return absl::OkStatus();
  }
  if (!S_ISDIR(st.st_mode)) return absl::OkStatus();
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return absl::OkStatus();
  std::vector<std::string> names;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(dir);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) RETURN_IF_ERROR(DigestPath(path + "/" + n, files, text));
  return absl::OkStatus();
}

// The .py files beside a Python model (it may import them), sorted.
std::vector<std::string> SiblingSources(const std::string& model_path) {
  const std::string folder = model_path.substr(0, model_path.rfind('/') + 1);
  std::vector<std::string> out;
  DIR* dir = opendir(folder.empty() ? "." : folder.c_str());
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.size() > 3 && name.compare(name.size() - 3, 3, ".py") == 0) out.push_back(folder + name);
  }
  closedir(dir);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

absl::StatusOr<std::string> PredictionModelDigest(const JobConfig& config, const std::string& model_sha256) {
  const ModelRef model = ParseModelRef(config.model);
  if (!model.python) return model_sha256.empty() ? Sha256FileHex(model.path) : model_sha256;
  std::string text = absl::StrCat("python model ", model.class_name, "\ninterpreter ",
                                  config.python.empty() ? "python3" : config.python, "\n");
  int files = 0;
  for (const std::string& source : SiblingSources(model.path)) RETURN_IF_ERROR(DigestPath(source, &files, &text));
  for (const auto& [k, v] : config.model_options) {
    absl::StrAppend(&text, "option ", k, "=", v, "\n");
    RETURN_IF_ERROR(DigestPath(v, &files, &text));
  }
  return Sha256Hex(text);
}

std::string PredictionSettingsDigest(const JobConfig& config, ModelRunner& runner, int batch_size) {
  std::vector<std::string> map;
  for (const auto& [from, to] : config.label_map) map.push_back(absl::StrCat(from, ":", to));
  const RunnerStats stats = runner.Stats();
  const std::string text = absl::StrCat(
      "precision ", static_cast<int>(config.precision), "\ninput ", config.input_height, "x", config.input_width,
      "\nmean ", absl::StrJoin(config.mean, ","), "\nstd ", absl::StrJoin(config.std, ","), "\nlabel map ",
      absl::StrJoin(map, ","), "\ndecode ", config.decode_mode, config.decode_gpu ? " gpu" : " cpu", "\ncompile ",
      config.compile ? "on" : "off", "\ndevice ", runner.is_cuda() ? "cuda " : "cpu ", stats.gpu_name,
      // GPU kernels may change with the batch's size; on the CPU Tally's outputs do not.
      "\nbatch ", runner.is_cuda() ? batch_size : 0, "\n");
  return Sha256Hex(text);
}

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

// One batch: its rows found in the store (scored here) and the rest, run by the model as a batch
// of their own (`inner`, whose item j is the batch's item misses_[j]).
class StorePendingBatch final : public PendingBatch {
 public:
  StorePendingBatch(const PredictionStore* store, BatchSpec spec, std::vector<StoreKey> keys,
                    std::vector<std::unique_ptr<StoredPrediction>> hits, std::vector<int> misses,
                    std::unique_ptr<PendingBatch> inner)
      : store_(store), spec_(std::move(spec)), keys_(std::move(keys)), hits_(std::move(hits)),
        misses_(std::move(misses)), inner_(std::move(inner)), slot_(spec_.items.size(), -1) {
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
  const int64_t* threshold_counts(int i) const override { return hit(i) ? nullptr : inner_->threshold_counts(slot_[i]); }
  const std::vector<CocoInstance>* instances(int i) const override {
    return hit(i) ? nullptr : inner_->instances(slot_[i]);
  }
  bool from_store(int i) const override { return hit(i); }

 private:
  bool hit(int i) const { return slot_[i] < 0; }
  void Store();  // The model's rows into the store.

  const PredictionStore* store_;
  BatchSpec spec_;
  std::vector<StoreKey> keys_;
  std::vector<std::unique_ptr<StoredPrediction>> hits_;  // Per item; null for the model's rows.
  std::vector<int> misses_;
  std::unique_ptr<PendingBatch> inner_;
  std::vector<int> slot_;  // Item -> its index in inner_'s batch, or -1 (from the store).
  int k_ = 0;
  std::vector<int64_t> counts_;
  std::vector<std::string> errors_;
};

absl::Status StorePendingBatch::Wait() {
  if (inner_) RETURN_IF_ERROR(inner_->Wait());
  k_ = inner_ ? inner_->num_classes() : 0;
  for (const auto& h : hits_) {
    if (h && k_ == 0) k_ = h->classes;
  }
  const size_t n = spec_.items.size();
  counts_.assign(n * k_ * k_, 0);
  errors_.assign(n, "");
  ParallelFor(n, [&](size_t i) {
    if (!hits_[i]) return;
    if (hits_[i]->classes != k_) {
      errors_[i] = absl::StrCat("the prediction store's entry has ", hits_[i]->classes, " classes, the model ", k_);
      return;
    }
    const BatchImage& it = spec_.items[i];
    const uint16_t* mask = reinterpret_cast<const uint16_t*>(spec_.masks->data()) + it.mask_offset;
    CountConfusionMatrix(hits_[i]->labels.data(), mask, hits_[i]->labels.size(), k_, counts_.data() + i * k_ * k_);
  });
  if (inner_) Store();
  return absl::OkStatus();
}

void StorePendingBatch::Store() {
  static std::atomic<bool> warned{false};
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
    if (absl::Status s = store_->Write(keys_[i], p); !s.ok() && !warned.exchange(true)) {
      Log("prediction store: ", s.message(), " (rows are scored all the same; logged once)");
    }
  });
}

class StoreRunner final : public ModelRunner {
 public:
  StoreRunner(ModelRunner* inner, StoreRunnerOptions options)
      : inner_(inner), options_(std::move(options)), store_(options_.root) {}

  absl::StatusOr<std::unique_ptr<PendingBatch>> Launch(const BatchSpec& batch) override;

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
  void SetChannelsLast(bool on) override { inner_->SetChannelsLast(on); }
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
  StoreKey KeyOf(const BatchSpec& batch, const BatchImage& it) const;

  ModelRunner* inner_;
  const StoreRunnerOptions options_;
  const PredictionStore store_;
};

StoreKey StoreRunner::KeyOf(const BatchSpec& batch, const BatchImage& it) const {
  StoreKey key;
  if (it.image_digest == nullptr || it.image_digest->size() != 16) return key;  // Unknown bytes: never stored.
  key.model = options_.model_digest;
  // What the runner decided at run time: the layout (a trial's), the JPEG decoder.
  key.settings = Sha256Hex(absl::StrCat(options_.settings_digest, inner_->ChannelsLast() ? " channels-last" : "",
                                        batch.decoded_on_gpu ? " nvjpeg" : ""));
  key.input = Hex128(*it.image_digest);
  if (options_.columns_are_input && it.row != nullptr) {
    std::string columns = key.input;
    for (int c = 0; c < it.row->columns_size() && c < static_cast<int>(options_.columns.size()); ++c) {
      absl::StrAppend(&columns, "\n", options_.columns[c], "=", it.row->columns(c));
    }
    key.input = Sha256Hex(columns).substr(0, 32);
  }
  return key;
}

absl::StatusOr<std::unique_ptr<PendingBatch>> StoreRunner::Launch(const BatchSpec& batch) {
  const size_t n = batch.items.size();
  std::vector<StoreKey> keys(n);
  std::vector<std::unique_ptr<StoredPrediction>> hits(n);
  std::vector<int> misses;
  ParallelFor(n, [&](size_t i) {
    const BatchImage& it = batch.items[i];
    keys[i] = KeyOf(batch, it);
    if (keys[i].input.empty()) return;
    absl::StatusOr<StoredPrediction> p = store_.Read(keys[i], it.height, it.width);
    if (p.ok()) {
      hits[i] = std::make_unique<StoredPrediction>(*std::move(p));
    } else if (p.status().code() == absl::StatusCode::kDataLoss) {
      Log("prediction store: ", p.status().message(), "; the row is predicted again");
    }
  });
  for (size_t i = 0; i < n; ++i) {
    if (!hits[i]) misses.push_back(static_cast<int>(i));
  }
  std::unique_ptr<PendingBatch> inner;
  if (!misses.empty()) {
    BatchSpec sub = batch;
    sub.items.clear();
    for (int i : misses) sub.items.push_back(batch.items[i]);
    sub.want_labels = true;  // Back to the host, for the store.
    sub.keep_labels = false;
    ASSIGN_OR_RETURN(inner, inner_->Launch(sub));
  }
  return std::unique_ptr<PendingBatch>(
      new StorePendingBatch(&store_, batch, std::move(keys), std::move(hits), std::move(misses), std::move(inner)));
}

}  // namespace

std::unique_ptr<ModelRunner> WrapWithStore(ModelRunner* inner, StoreRunnerOptions options) {
  return std::make_unique<StoreRunner>(inner, std::move(options));
}

}  // namespace tally
