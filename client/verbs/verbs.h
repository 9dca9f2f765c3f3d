// tally's verbs, one file each (git's builtin/, kubectl's cmd/): each verb takes its flags as a
// typed struct, filled once by client/main.cc (where every flag is defined), and returns the
// process exit code (client/client.h kExit*). client/cli.h says which flags each verb takes.
#ifndef TALLY_CLIENT_VERBS_VERBS_H_
#define TALLY_CLIENT_VERBS_VERBS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "proto/tally.pb.h"

namespace tally {

// How to reach tallyd (SECURITY.md).
struct ConnectionFlags {
  std::string server;
  std::string tls_ca, tls_cert, tls_key, tls_server_name;
  std::string token_file;  // Empty: the TALLY_TOKEN environment variable.
};

// A job's settings as typed on the command line; client/job_flags.h turns them into a JobSpec.
struct JobFlags {
  std::string model, manifest, name, metrics, batch_size;
  int shard_size = 0;
  std::string mean, std, input_size, spacing;
  bool force_spacing = false;
  int num_classes = 0;
  std::string regions;
  bool nnunet_summary = false;
  double nsd_tolerance = 1.0;
  bool include_background = false;
  std::string precision, channels_last, decode, max_memory;
  int64_t max_image_pixels = 0;
  double batch_timeout = 0;
  std::string nonfinite, ignore_index, label_map;
  std::string python, thresholds, empty_score, iou_thresholds, json_infinity;
  double max_failed_fraction = 0;
  int thumbnails = 5;
  std::string save_predictions;
  std::string prediction_store;
  std::string store_max_bytes;  // A size (--store-max-bytes), or "".
  std::string coco, coco_images, coco_results;  // COCO jobs (docs/instances.md "Instances").
  // docs/data.md "Where your data can be": two folders (--images = coco_images, --masks), tar shards.
  std::string masks, mask_suffix, shards, image_ext, mask_ext, prediction_ext;
  std::string coco_panoptic, panoptic_dir, panoptic_predictions, panoptic_predictions_dir;
  std::vector<std::string> model_options;  // KEY=VALUE, repeatable.
  std::vector<std::string> labels;         // KEY=VALUE, repeatable.
  // Lesion-wise metrics (docs/metrics.md "Lesion-wise metrics"); defaults are BraTS-GLI's.
  int connectivity = 0;
  int lesion_dilation = 3;
  double lesion_min_volume = 50, lesion_max_hd95 = 374, lesion_iou = 0;
  // Volume jobs (docs/volumes.md "Volumes into models").
  std::string sliding_window, intensity;
  std::string window;  // --window CENTRE,WIDTH (16-bit and DICOM images).
  double overlap = 0.5;
  int sw_batch_size = 0;
  bool keep_dtype = false;
  // Answers before the end (docs/metrics.md "Answers before the end").
  std::string order;               // manifest | random[:SEED]; "": manifest unless sampling
  double until_ci = 0;
  int64_t min_rows = 0;
  std::string sample;              // N or P%
  std::string speculate_after;     // auto (""), off, or seconds
  int64_t canary = 0;              // Rows every worker evaluates first and must agree on.
  int32_t priority = 0;            // Among the owner's jobs (README "Operating tallyd").
  bool compile = false;            // Python models: torch.compile (docs/models.md "Compiled models").
  // Where the model fails (docs/reports.md "Groups" and "Failing slices").
  std::string group_by;            // Terms joined by ','.
  int32_t min_group_rows = 20;
  bool find_slices = false;
};

// The workers `tally run` and `tally estimate` start on this machine.
struct LocalWorkerFlags {
  int workers = 1;
  std::string gpus;  // all | 0,1,... ; empty: CPU workers.
  int gpus_per_worker = 1;
  double lease_seconds = 5.0;
  bool count_logit_ties = false;
  int worker_threads = 0;
  std::string max_worker_memory;  // A size, "none", or "" (the workers' default).
  std::vector<std::string> worker_flags;
};

// tally follow DIR (docs/follow.md).
struct FollowFlags {
  ConnectionFlags connection;
  std::vector<std::string> positional;  // The trainer's folder.
  JobFlags job;                         // Each checkpoint's job (its model: the checkpoint).
  std::string pattern = "*.pt", step_regex, ready_marker, catch_up = "newest", race = "on", follow_metric = "dice";
  std::string on_new_best;
  double settle = 30, race_margin = 0, idle = 0;
  int load_retries = 3;
  int64_t until_step = 0;
  bool detach = false, json = false;
};
struct RunFlags {
  JobFlags job;
  LocalWorkerFlags local;
  std::string out;
  std::string predictions, references, file_ending;  // nnU-Net's folder convention.
  // --follow DIR: a follow of the trainer's folder instead of one job, until --until-step or --idle.
  std::string follow;
  FollowFlags follow_flags;
};
int RunVerb(const RunFlags& flags);

// tally rescore (client/verbs/rescore.cc): a run's flags, the store, and CPU workers.
struct RescoreFlags {
  ConnectionFlags connection;  // JOB: the job whose model, data and store are rescored.
  std::vector<std::string> positional;
  JobFlags job;
  LocalWorkerFlags local;
  std::string out;
  std::string from_store;
  std::string store_settings;  // A settings digest's prefix: which stored run, where the store has several.
};
int RescoreVerb(const RescoreFlags& flags);

struct EstimateFlags {
  JobFlags job;
  LocalWorkerFlags local;
  int max_batch = 0;
  bool json = false;
};
int EstimateVerb(const EstimateFlags& flags);

struct SubmitFlags {
  ConnectionFlags connection;
  JobFlags job;
  bool json = false;
};
int SubmitVerb(const SubmitFlags& flags);

// Verbs about jobs named on the command line (ids or unambiguous prefixes).
struct JobVerbFlags {
  ConnectionFlags connection;
  std::vector<std::string> jobs;  // The positional arguments.
  bool json = false;
  double timeout = 0;  // watch, wait: give up after this many seconds (0: never).
  std::string out;     // report, compare, merge: the folder for the files.
  bool partial = false;  // report: a running job's report over the rows committed so far.
};
int WatchVerb(const JobVerbFlags& flags);
int WaitVerb(const JobVerbFlags& flags);
int StatusVerb(const JobVerbFlags& flags);
int CancelVerb(const JobVerbFlags& flags);
int DeleteVerb(const JobVerbFlags& flags);
int ReportVerb(const JobVerbFlags& flags);
int CompareVerb(const JobVerbFlags& flags);
int MergeVerb(const JobVerbFlags& flags);

int FollowVerb(const FollowFlags& flags);
int FollowsVerb(const ConnectionFlags& connection, bool json);
int CancelFollowVerb(const ConnectionFlags& connection, const std::string& follow_id);
int DeleteFollowVerb(const ConnectionFlags& connection, const std::string& follow_id);
// Shared with tally run --follow: the follow's spec from the flags, and its progress until it ends
// (exit 0 finished, 4 cancelled).
absl::StatusOr<v1::FollowSpec> FollowSpecFromFlags(const FollowFlags& flags, const std::string& folder);
int WatchFollow(TallyClient& client, const std::string& follow_id, bool json);

struct JobsFlags {
  ConnectionFlags connection;
  std::string state;
  std::vector<std::string> labels;
  int limit = 20;
  std::string page_token;
  bool json = false;
};
int JobsVerb(const JobsFlags& flags);

struct WorkersFlags {
  ConnectionFlags connection;
  bool json = false;
};
int WorkersVerb(const WorkersFlags& flags);

// tallyd's gRPC health: prints SERVING (exit 0) or what else it says (exit 1); unreachable: 5.
// The container image's HEALTHCHECK.
int HealthVerb(const ConnectionFlags& connection);

int GpusVerb(bool json);

// tally verify OUT: the report folder's rows whose files differ now from what they were scored from.
// tally slices OUT: the failing slices of a finished job's report folder (client/verbs/slices.cc).
struct SlicesFlags {
  std::vector<std::string> positional;  // OUT, or JOB with connection.server.
  ConnectionFlags connection;
  std::string manifest;          // Default: the one report.json records.
  std::string metric = "dice";   // --slice-metric
  int bins = 4;                  // --slice-bins
  bool json = false;
};
int SlicesVerb(const SlicesFlags& flags);

// tally export: a network as an AOTInductor package (python/tally/export.py; docs/models.md).
struct ExportFlags {
  std::vector<std::string> positional;
  std::string model, out, input_size, batch_size, precision, python, cxx;
  std::vector<std::string> model_options;
};
int ExportVerb(const ExportFlags& flags);

struct VerifyFlags {
  std::vector<std::string> positional;
};
int VerifyVerb(const VerifyFlags& flags);

// tally store stats|ls|export|gc DIR: the prediction store's entries by model, each entry, every
// entry as a PNG (--out), or the least recently used dropped past --max-bytes (docs/prediction-store.md).
struct StoreFlags {
  std::vector<std::string> positional;  // stats|ls|export|gc DIR.
  std::string max_bytes;
  bool json = false;
  std::string out;
};
int StoreVerb(const StoreFlags& flags);

struct TokenFlags {
  std::vector<std::string> positional;  // NAME ROLE.
  std::string tokens_file;
  std::string out;  // Write the token here (mode 0600) instead of stdout.
};
int TokenVerb(const TokenFlags& flags);

}  // namespace tally

#endif  // TALLY_CLIENT_VERBS_VERBS_H_
