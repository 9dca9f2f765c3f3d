// tally: the command-line client.
//
//   tally run --model model.pt --manifest data/manifest.csv --out results/ --workers 3
//   tally run --model model.pt --manifest data/manifest.csv --out results/ --gpus all
//   tally submit --server host:50051 --model /abs/model.pt --manifest /abs/manifest.csv
//   tally watch|status|cancel|report JOB_ID --server host:50051 [--out DIR]
//   tally jobs --server host:50051
//
// Flags accept dashes or underscores. See docs/cli.md "CLI" for every flag. Every flag is defined here;
// each verb (client/verbs/) takes the ones it uses as a typed struct, read below.
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "client/cli.h"
#include "client/client.h"
#include "client/verbs/verb_util.h"
#include "client/verbs/verbs.h"
#include "base/flag_util.h"
#include "common/job/rpc.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "tallyd address (host:port) for submit/watch/status/...");
// Security (SECURITY.md).
ABSL_FLAG(std::string, tls_ca, "", "Connect with TLS, trusting this CA for tallyd's certificate");
ABSL_FLAG(std::string, tls_cert, "", "Client certificate for mutual TLS (with --tls-key)");
ABSL_FLAG(std::string, tls_key, "", "Private key of --tls-cert");
ABSL_FLAG(std::string, tls_server_name, "", "Name to check tallyd's certificate against (default: the host of --server)");
ABSL_FLAG(std::string, token_file, "", "File holding your token (default: the TALLY_TOKEN environment variable)");
ABSL_FLAG(std::string, tokens_file, "", "tally token: append the new token's line to this --auth-tokens file");
// Job spec.
ABSL_FLAG(std::string, model, "", "TorchScript model file (none: score the manifest's prediction column)");
ABSL_FLAG(std::string, manifest, "", "Manifest CSV (columns image, mask[, id]; or mask, prediction[, id])");
ABSL_FLAG(std::string, name, "", "Job label");
ABSL_FLAG(std::string, metrics, "",
          "Comma list of metrics, all (every per-pixel one) or lesion (every lesion_ one) (default "
          "dice,iou,precision,recall,hd95; COCO instance jobs leave out hd95)");
ABSL_FLAG(std::string, batch_size, "", "Images per forward pass, or auto (default: 8 on CPU, 32 on GPU)");
ABSL_FLAG(int, shard_size, 0, "Rows per shard (0 = automatic)");
ABSL_FLAG(std::string, mean, "", "Per-channel mean on [0,1] inputs, e.g. 0.485,0.456,0.406");
ABSL_FLAG(std::string, std, "", "Per-channel std, e.g. 0.229,0.224,0.225");
ABSL_FLAG(std::string, input_size, "", "Resize inputs to HxW (bilinear) before the model");
ABSL_FLAG(std::string, spacing, "",
          "Spacing for surface distances: sy,sx (2D, default 1,1) or sz,sy,sx (3D, default: the NIfTI header)");
ABSL_FLAG(bool, force_spacing, false, "Use --spacing z,y,x even where it contradicts a volume's header");
ABSL_FLAG(int, num_classes, 0, "Predictions: number of classes (0 = the largest label in the set plus one)");
ABSL_FLAG(std::string, regions, "", "Predictions: evaluate regions (unions of labels) instead of classes, e.g. \"1,2;2\"");
ABSL_FLAG(bool, nnunet_summary, false, "Also write summary.json in nnU-Net v2's layout");
ABSL_FLAG(std::string, predictions, "", "tally run: folder of predictions, paired by file name with --references");
ABSL_FLAG(std::string, references, "", "tally run: folder of reference masks (nnU-Net's folder convention)");
ABSL_FLAG(std::string, file_ending, ".nii.gz", "tally run --predictions: the files to pair, by ending");
ABSL_FLAG(double, nsd_tolerance, 1.0, "Tolerance for nsd, in the units of the spacing");
ABSL_FLAG(bool, include_background, false, "Count class 0 in the foreground means");
ABSL_FLAG(std::string, precision, "fp32", "fp32, bf16 or fp16 (autocast)");
ABSL_FLAG(std::string, channels_last, "auto",
          "auto (a timed trial on the first batch picks the faster layout; TorchScript on CUDA), on or off; "
          "a bare --channels-last means on");
ABSL_FLAG(std::string, decode, "cpu",
          "Where JPEG images are decoded: cpu (libjpeg-turbo: the same pixels on every machine), gpu (nvJPEG: "
          "pixels differ by a few levels) or auto (gpu when the CPU decoders cannot keep up with the model)");
ABSL_FLAG(std::string, max_memory, "", "With --batch-size auto: fraction of GPU memory (0.8) or GiB (20)");
ABSL_FLAG(int64_t, max_image_pixels, 0, "Images/masks declaring more pixels fail their row (0 = 2^28)");
ABSL_FLAG(double, batch_timeout, 0, "Seconds a decode or forward pass may take before its rows fail (0 = 600)");
ABSL_FLAG(std::string, nonfinite, "fail", "Rows whose model output has NaN/Inf: fail, or warn (evaluate them)");
ABSL_FLAG(std::string, ignore_index, "255", "Mask value that leaves every count, or none");
ABSL_FLAG(std::string, label_map, "", "Mask value -> label before anything else, e.g. 0:0,255:1");
// Python models and referring-segmentation conventions.
ABSL_FLAG(std::string, python, "", "Python models: the interpreter on the worker hosts (default python3)");
ABSL_FLAG(std::string, thresholds, "", "Single-score outputs: also count at these probability thresholds, e.g. 0.3,0.5,0.7");
ABSL_FLAG(std::string, empty_score, "nan", "dice/iou of an image whose prediction and reference are both empty: nan or one");
ABSL_FLAG(std::string, iou_thresholds, "", "Per class, the share of images with IoU >= t, e.g. 0.5,0.7,0.9");
ABSL_FLAG(std::string, json_infinity, "number",
          "How report.json writes infinity: number (1e999) or string (\"inf\", for jq and other strict tools)");
ABSL_FLAG(int, connectivity, 0,
          "Lesion metrics: neighbours of a component's voxels, 4 or 8 (2D), 6, 18 or 26 (3D); 0 = full (8, 26)");
ABSL_FLAG(int, lesion_dilation, 3,
          "Lesion metrics: dilation steps merging nearby reference lesions and matching components (BraTS: 3; "
          "MEN/MET: 1; 0: none)");
ABSL_FLAG(double, lesion_min_volume, 50,
          "Lesion metrics: reference lesions of at most this volume (voxels x spacing) are left out (BraTS-MET: 2)");
ABSL_FLAG(double, lesion_max_hd95, 374, "Lesion metrics: the HD95 of a missed or false-positive lesion");
ABSL_FLAG(double, lesion_iou, 0,
          "Lesion metrics: match components one to one at IoU >= this (panoptica) instead of by dilation; 0: dilation");
ABSL_FLAG(std::string, sliding_window, "",
          "Volume jobs, TorchScript: run the model on patches of D,H,W voxels blended with a Gaussian (MONAI's "
          "sliding_window_inference); empty: whole volumes");
ABSL_FLAG(double, overlap, 0.5, "Volume jobs: the sliding window's overlap, in [0, 1)");
ABSL_FLAG(int, sw_batch_size, 0, "Volume jobs: sliding-window patches per forward pass (0: 4)");
ABSL_FLAG(std::string, intensity, "",
          "Volume jobs: intensity preprocessing of every channel: none, zscore, or clip:LO,HI (clip and scale to [0, 1])");
ABSL_FLAG(std::string, window, "",
          "16-bit and DICOM images: CENTRE,WIDTH of the window that maps their values to 0..255 (DICOM: default the "
          "header's window)");
ABSL_FLAG(bool, keep_dtype, false, "Volume jobs, Python models: the stored voxels in their own type, not float32");
ABSL_FLAG(bool, partial, false,
          "tally report: a running job's report over the rows committed so far (built on demand; its intervals are "
          "those of the rows so far)");
ABSL_FLAG(std::string, order, "",
          "The order rows are evaluated in: manifest (the default) or random[:SEED] (a seeded permutation fixed at "
          "submission: every prefix is a uniform random sample; final reports identical)");
ABSL_FLAG(double, until_ci, 0,
          "End the job once every foreground class's mean-Dice 95% interval half-width is <= this (implies --order "
          "random; the rest of the rows are not evaluated (sample))");
ABSL_FLAG(int64_t, min_rows, 0, "--until-ci: evaluate at least this many rows first (0 = 100)");
ABSL_FLAG(std::string, sample, "", "Evaluate a uniform random subset: N rows or P% of them (implies --order random)");
ABSL_FLAG(bool, compile, false,
          "Python models: compile the model's torch.nn.Module attributes with torch.compile before the first batch "
          "(needs torch 2 in the model's interpreter; refused, never run uncompiled, without it)");
ABSL_FLAG(std::string, group_by, "",
          "Per-group tables in every report: manifest columns, dicom:KEYWORD and derived:PROPERTY[:BINS] (fg_fraction, volume_ratio, "
          "components, pixels, mean_intensity), comma-separated; NAME:K bins a numeric column into K quantile bins");
ABSL_FLAG(int32_t, min_group_rows, 20, "--group-by: groups with fewer evaluated rows are shown but marked");
ABSL_FLAG(bool, find_slices, false,
          "The report searches every manifest column and derived property (and pairs) for failing slices, as tally "
          "slices does");
ABSL_FLAG(int32_t, priority, 0,
          "Among your own running jobs, workers go to those of the highest priority first (owners share the workers "
          "fairly whatever their priorities; README \"Operating tallyd\")");
ABSL_FLAG(int64_t, canary, 0,
          "Every worker first evaluates the first N rows of the job's order as well; a worker whose results disagree "
          "with the majority's is named in the report's warnings and taken out of the job (0: off)");
ABSL_FLAG(std::string, speculate_after, "auto",
          "With no shard left to lease, copy a shard leased longer than this (seconds) to an idle worker; the first "
          "commit of each row wins. auto: 3x the job's median shard time, at least 10 s; off: never");
ABSL_FLAG(double, max_failed_fraction, 0,
          "More failed rows than this share of the manifest: a warning, and exit code 3 (0 = any failed row)");
ABSL_FLAG(int, thumbnails, 5, "report.html: thumbnails of this many worst images per class (0-10; 0 = none)");
ABSL_FLAG(std::string, save_predictions, "",
          "Models: write every predicted label map into this folder on the worker hosts, as <id>.png");
ABSL_FLAG(std::string, prediction_store, "",
          "Models: keep every row's prediction in this folder by (model, settings, input) digests, and score rows "
          "found there without running the model (docs/prediction-store.md)");
ABSL_FLAG(std::string, store_max_bytes, "",
          "With --prediction-store: the most the store may hold (e.g. 200GiB); workers drop its least recently used "
          "entries past it");
ABSL_FLAG(std::string, from_store, "", "tally rescore: the prediction store whose entries are scored (no model runs)");
ABSL_FLAG(std::string, store_settings, "",
          "tally rescore: which stored run to score (a settings digest's prefix), where the store has several");
// COCO instance jobs (docs/instances.md "Instances").
ABSL_FLAG(std::string, coco, "",
          "COCO instance annotations (instances.json): without --manifest, one row per image (with --images), scored "
          "as instances (COCO mask AP); with a manifest, resolves its coco_ann_ids column");
ABSL_FLAG(std::string, images, "",
          "With --masks: the folder of images, paired with masks by their path without extension (recursive); with "
          "--coco: the folder images[].file_name is relative to");
ABSL_FLAG(std::string, masks, "", "With --images: the folder of masks (docs/data.md \"Two folders\")");
ABSL_FLAG(std::string, mask_suffix, "",
          "With --images/--masks: what mask names add before their extension (001_mask.png: _mask)");
ABSL_FLAG(std::string, shards, "",
          "Tar shards instead of a manifest (WebDataset's convention): paths, brace ranges "
          "('train-{000000..000999}.tar'), globs, or a text file listing one shard a line");
ABSL_FLAG(std::string, image_ext, "", "With --shards: image members' extensions (default jpg,jpeg,png,tif,tiff,webp)");
ABSL_FLAG(std::string, mask_ext, "", "With --shards: mask members' extensions (default seg.png,mask.png)");
ABSL_FLAG(std::string, prediction_ext, "",
          "With --shards and no --model: prediction members' extensions (default pred.png)");
ABSL_FLAG(std::string, coco_results, "", "With --coco: detections in COCO's results format, scored instead of a model");
ABSL_FLAG(std::string, coco_panoptic, "",
          "COCO panoptic annotations (panoptic.json): one row per annotation, scored as panoptic quality (PQ)");
ABSL_FLAG(std::string, panoptic_dir, "", "With --coco-panoptic: the folder of its PNGs (segment ids as RGB)");
ABSL_FLAG(std::string, panoptic_predictions, "", "With --coco-panoptic: the predictions, a panoptic JSON");
ABSL_FLAG(std::string, panoptic_predictions_dir, "",
          "With --coco-panoptic: the predictions' PNGs (default: the JSON's path without .json)");
ABSL_FLAG(int, gpus_per_worker, 1, "tally run --gpus: GPUs per worker (Python models spread over them)");
// tally run.
ABSL_FLAG(std::string, out, "", "Output folder for the reports");
ABSL_FLAG(std::string, cxx, "", "tally export: the C++ compiler of the package's wrapper (default: g++ on PATH)");
ABSL_FLAG(int, workers, 1, "tally run: number of CPU workers");
ABSL_FLAG(std::string, gpus, "", "tally run: all or 0,1,... (one worker per GPU)");
ABSL_FLAG(double, lease_seconds, 5.0, "tally run: a worker silent this long loses its shards");
ABSL_FLAG(bool, count_logit_ties, false, "tally run: workers count pixels whose top two logits tie");
ABSL_FLAG(int, worker_threads, 0, "tally run: decode threads per worker (0 = its share of the cores)");
ABSL_FLAG(std::string, max_worker_memory, "",
          "tally run: host memory each worker's rows may use, e.g. 4GiB, or none (default: its cgroup's limit or the "
          "machine's memory, shared by GPU workers); a row that needs more fails with the reason");
ABSL_FLAG(std::vector<std::string>, worker_flags, {},
          "tally run: extra tally-worker flags, comma-separated, e.g. --worker-flags=--gpu-memory-limit-gib=8");
// tally estimate.
ABSL_FLAG(int, max_batch, 0, "tally estimate: largest batch size to try (0 = 512 on a GPU, 16 on CPU)");
// Listing.
ABSL_FLAG(int, limit, 20, "tally jobs: how many jobs to list");
ABSL_FLAG(std::string, page_token, "", "tally jobs: continue after this job id (printed at the end of a page)");
ABSL_FLAG(std::string, state, "", "tally jobs: only jobs in this state (queued, running, succeeded, failed, cancelled)");
// Scripting.
ABSL_FLAG(std::string, max_bytes, "", "tally store gc: the most bytes the store may keep (e.g. 200GiB)");
ABSL_FLAG(std::string, slice_metric, "dice",
          "tally slices: each row's value, dice or iou over its foreground classes, or dice:K / iou:K for class K");
ABSL_FLAG(int, slice_bins, 4, "tally slices: quantile bins of a numeric column with more than 20 values");
ABSL_FLAG(bool, json, false, "Print JSON (one object; watch: one per line) instead of text");
// tally follow DIR (docs/follow.md).
ABSL_FLAG(std::string, pattern, "*.pt", "tally follow: checkpoint file names in the folder (a shell glob)");
ABSL_FLAG(std::string, step_regex, "",
          "tally follow: the step is this regex's first group in a checkpoint's name (default: its last digits)");
ABSL_FLAG(double, settle, 30, "tally follow: seconds a checkpoint's size and time must stay unchanged before it is taken");
ABSL_FLAG(std::string, ready_marker, "",
          "tally follow: a checkpoint is taken at once when this file exists ('{}.done': {} is its name)");
ABSL_FLAG(int, load_retries, 3, "tally follow: loads of a checkpoint that may fail before it is failed");
ABSL_FLAG(std::string, catch_up, "newest",
          "tally follow: behind the trainer, newest (the newest next, older ones skipped) or all (newest first)");
ABSL_FLAG(std::string, race, "on", "tally follow: on (stop a checkpoint once decided worse than the best) or off");
ABSL_FLAG(double, race_margin, 0, "tally follow: decided worse once the mean difference's interval is below -margin");
ABSL_FLAG(std::string, follow_metric, "dice", "tally follow: what best goes by: dice, iou, dice:K or iou:K");
ABSL_FLAG(bool, detach, false, "tally follow: print the follow's id and return (tallyd follows on)");
ABSL_FLAG(int64_t, until_step, 0, "tally follow / run --follow: end once a checkpoint at or past this step is decided");
ABSL_FLAG(std::string, follow, "", "tally run: follow this training run's checkpoint folder (with --until-step or --idle)");
ABSL_FLAG(std::string, on_new_best, "",
          "tally follow: a command run on tallyd's host when a checkpoint becomes the best (admin tokens only)");
ABSL_FLAG(double, idle, 0, "tally follow / run --follow: end after this many seconds with nothing new (0: never)");
ABSL_FLAG(double, timeout, 0, "watch/wait: give up after this many seconds with exit code 6 (0 = never)");

namespace tally {
namespace {

// The command line once Abseil has parsed it: the verb's positional words and the repeatable
// flags taken out of argv before.
struct Invocation {
  std::vector<std::string> positional;
  std::vector<std::string> model_options;
  std::vector<std::string> labels;
};

ConnectionFlags ReadConnectionFlags() {
  ConnectionFlags f;
  f.server = absl::GetFlag(FLAGS_server);
  f.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  f.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  f.tls_key = absl::GetFlag(FLAGS_tls_key);
  f.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  f.token_file = absl::GetFlag(FLAGS_token_file);
  return f;
}

// The job spec's flags, as typed.
JobFlags ReadJobFlags(const Invocation& in) {
  JobFlags f;
  f.model = absl::GetFlag(FLAGS_model);
  f.manifest = absl::GetFlag(FLAGS_manifest);
  f.name = absl::GetFlag(FLAGS_name);
  f.metrics = absl::GetFlag(FLAGS_metrics);
  f.batch_size = absl::GetFlag(FLAGS_batch_size);
  f.shard_size = absl::GetFlag(FLAGS_shard_size);
  f.mean = absl::GetFlag(FLAGS_mean);
  f.std = absl::GetFlag(FLAGS_std);
  f.input_size = absl::GetFlag(FLAGS_input_size);
  f.spacing = absl::GetFlag(FLAGS_spacing);
  f.force_spacing = absl::GetFlag(FLAGS_force_spacing);
  f.num_classes = absl::GetFlag(FLAGS_num_classes);
  f.regions = absl::GetFlag(FLAGS_regions);
  f.nnunet_summary = absl::GetFlag(FLAGS_nnunet_summary);
  f.nsd_tolerance = absl::GetFlag(FLAGS_nsd_tolerance);
  f.include_background = absl::GetFlag(FLAGS_include_background);
  f.precision = absl::GetFlag(FLAGS_precision);
  f.channels_last = absl::GetFlag(FLAGS_channels_last);
  f.decode = absl::GetFlag(FLAGS_decode);
  f.max_memory = absl::GetFlag(FLAGS_max_memory);
  f.max_image_pixels = absl::GetFlag(FLAGS_max_image_pixels);
  f.batch_timeout = absl::GetFlag(FLAGS_batch_timeout);
  f.nonfinite = absl::GetFlag(FLAGS_nonfinite);
  f.ignore_index = absl::GetFlag(FLAGS_ignore_index);
  f.label_map = absl::GetFlag(FLAGS_label_map);
  f.python = absl::GetFlag(FLAGS_python);
  f.thresholds = absl::GetFlag(FLAGS_thresholds);
  f.empty_score = absl::GetFlag(FLAGS_empty_score);
  f.iou_thresholds = absl::GetFlag(FLAGS_iou_thresholds);
  f.json_infinity = absl::GetFlag(FLAGS_json_infinity);
  f.max_failed_fraction = absl::GetFlag(FLAGS_max_failed_fraction);
  f.thumbnails = absl::GetFlag(FLAGS_thumbnails);
  f.save_predictions = absl::GetFlag(FLAGS_save_predictions);
  f.prediction_store = absl::GetFlag(FLAGS_prediction_store);
  f.store_max_bytes = absl::GetFlag(FLAGS_store_max_bytes);
  f.coco = absl::GetFlag(FLAGS_coco);
  f.coco_images = absl::GetFlag(FLAGS_images);
  f.masks = absl::GetFlag(FLAGS_masks);
  f.mask_suffix = absl::GetFlag(FLAGS_mask_suffix);
  f.shards = absl::GetFlag(FLAGS_shards);
  f.image_ext = absl::GetFlag(FLAGS_image_ext);
  f.mask_ext = absl::GetFlag(FLAGS_mask_ext);
  f.prediction_ext = absl::GetFlag(FLAGS_prediction_ext);
  f.coco_results = absl::GetFlag(FLAGS_coco_results);
  f.coco_panoptic = absl::GetFlag(FLAGS_coco_panoptic);
  f.panoptic_dir = absl::GetFlag(FLAGS_panoptic_dir);
  f.panoptic_predictions = absl::GetFlag(FLAGS_panoptic_predictions);
  f.panoptic_predictions_dir = absl::GetFlag(FLAGS_panoptic_predictions_dir);
  f.model_options = in.model_options;
  f.labels = in.labels;
  f.connectivity = absl::GetFlag(FLAGS_connectivity);
  f.lesion_dilation = absl::GetFlag(FLAGS_lesion_dilation);
  f.lesion_min_volume = absl::GetFlag(FLAGS_lesion_min_volume);
  f.lesion_max_hd95 = absl::GetFlag(FLAGS_lesion_max_hd95);
  f.lesion_iou = absl::GetFlag(FLAGS_lesion_iou);
  f.sliding_window = absl::GetFlag(FLAGS_sliding_window);
  f.overlap = absl::GetFlag(FLAGS_overlap);
  f.sw_batch_size = absl::GetFlag(FLAGS_sw_batch_size);
  f.intensity = absl::GetFlag(FLAGS_intensity);
  f.keep_dtype = absl::GetFlag(FLAGS_keep_dtype);
  f.window = absl::GetFlag(FLAGS_window);
  f.order = absl::GetFlag(FLAGS_order);
  f.until_ci = absl::GetFlag(FLAGS_until_ci);
  f.min_rows = absl::GetFlag(FLAGS_min_rows);
  f.sample = absl::GetFlag(FLAGS_sample);
  f.speculate_after = absl::GetFlag(FLAGS_speculate_after);
  f.canary = absl::GetFlag(FLAGS_canary);
  f.priority = absl::GetFlag(FLAGS_priority);
  f.compile = absl::GetFlag(FLAGS_compile);
  f.group_by = absl::GetFlag(FLAGS_group_by);
  f.min_group_rows = absl::GetFlag(FLAGS_min_group_rows);
  f.find_slices = absl::GetFlag(FLAGS_find_slices);
  return f;
}

LocalWorkerFlags ReadLocalWorkerFlags() {
  LocalWorkerFlags f;
  f.workers = absl::GetFlag(FLAGS_workers);
  f.gpus = absl::GetFlag(FLAGS_gpus);
  f.gpus_per_worker = absl::GetFlag(FLAGS_gpus_per_worker);
  f.lease_seconds = absl::GetFlag(FLAGS_lease_seconds);
  f.count_logit_ties = absl::GetFlag(FLAGS_count_logit_ties);
  f.worker_threads = absl::GetFlag(FLAGS_worker_threads);
  f.max_worker_memory = absl::GetFlag(FLAGS_max_worker_memory);
  f.worker_flags = absl::GetFlag(FLAGS_worker_flags);
  return f;
}

JobVerbFlags ReadJobVerbFlags(const Invocation& in) {
  JobVerbFlags f;
  f.connection = ReadConnectionFlags();
  f.jobs = in.positional;
  f.json = absl::GetFlag(FLAGS_json);
  f.timeout = absl::GetFlag(FLAGS_timeout);
  f.out = absl::GetFlag(FLAGS_out);
  f.partial = absl::GetFlag(FLAGS_partial);
  return f;
}

FollowFlags ReadFollowFlags(const Invocation& in) {
  FollowFlags f;
  f.connection = ReadConnectionFlags();
  f.positional = in.positional;
  f.job = ReadJobFlags(in);
  f.pattern = absl::GetFlag(FLAGS_pattern);
  f.step_regex = absl::GetFlag(FLAGS_step_regex);
  f.settle = absl::GetFlag(FLAGS_settle);
  f.ready_marker = absl::GetFlag(FLAGS_ready_marker);
  f.load_retries = absl::GetFlag(FLAGS_load_retries);
  f.catch_up = absl::GetFlag(FLAGS_catch_up);
  f.race = absl::GetFlag(FLAGS_race);
  f.race_margin = absl::GetFlag(FLAGS_race_margin);
  f.follow_metric = absl::GetFlag(FLAGS_follow_metric);
  f.detach = absl::GetFlag(FLAGS_detach);
  f.until_step = absl::GetFlag(FLAGS_until_step);
  f.idle = absl::GetFlag(FLAGS_idle);
  f.on_new_best = absl::GetFlag(FLAGS_on_new_best);
  f.json = absl::GetFlag(FLAGS_json);
  return f;
}

int Run(const Invocation& in) {
  return RunVerb({ReadJobFlags(in), ReadLocalWorkerFlags(), absl::GetFlag(FLAGS_out), absl::GetFlag(FLAGS_predictions),
                  absl::GetFlag(FLAGS_references), absl::GetFlag(FLAGS_file_ending), absl::GetFlag(FLAGS_follow),
                  ReadFollowFlags(in)});
}

int Rescore(const Invocation& in) {
  return RescoreVerb({ReadConnectionFlags(), in.positional, ReadJobFlags(in), ReadLocalWorkerFlags(),
                      absl::GetFlag(FLAGS_out), absl::GetFlag(FLAGS_from_store), absl::GetFlag(FLAGS_store_settings)});
}

int Estimate(const Invocation& in) {
  return EstimateVerb(
      {ReadJobFlags(in), ReadLocalWorkerFlags(), absl::GetFlag(FLAGS_max_batch), absl::GetFlag(FLAGS_json)});
}

int Submit(const Invocation& in) {
  return SubmitVerb({ReadConnectionFlags(), ReadJobFlags(in), absl::GetFlag(FLAGS_json)});
}

int Jobs(const Invocation& in) {
  return JobsVerb({ReadConnectionFlags(), absl::GetFlag(FLAGS_state), in.labels, absl::GetFlag(FLAGS_limit),
                   absl::GetFlag(FLAGS_page_token), absl::GetFlag(FLAGS_json)});
}

// The verb table: each verb's function, given what it takes (client/cli.cc lists their flags).
struct Handler {
  const char* verb;
  int (*run)(const Invocation&);
};
constexpr Handler kHandlers[] = {
    {"run", Run},
    {"rescore", Rescore},
    {"estimate", Estimate},
    {"submit", Submit},
    {"jobs", Jobs},
    {"health", [](const Invocation&) { return HealthVerb(ReadConnectionFlags()); }},
    {"workers", [](const Invocation&) { return WorkersVerb({ReadConnectionFlags(), absl::GetFlag(FLAGS_json)}); }},
    {"gpus", [](const Invocation&) { return GpusVerb(absl::GetFlag(FLAGS_json)); }},
    {"token", [](const Invocation& in) { return TokenVerb({in.positional, absl::GetFlag(FLAGS_tokens_file), absl::GetFlag(FLAGS_out)}); }},
    {"watch", [](const Invocation& in) { return WatchVerb(ReadJobVerbFlags(in)); }},
    {"wait", [](const Invocation& in) { return WaitVerb(ReadJobVerbFlags(in)); }},
    {"status", [](const Invocation& in) { return StatusVerb(ReadJobVerbFlags(in)); }},
    {"cancel", [](const Invocation& in) {
       // A follow's id (f...) stops the follow; anything else names a job.
       if (in.positional.size() == 1 && !in.positional[0].empty() && in.positional[0][0] == 'f') {
         return CancelFollowVerb(ReadConnectionFlags(), in.positional[0]);
       }
       return CancelVerb(ReadJobVerbFlags(in));
     }},
    {"follow", [](const Invocation& in) { return FollowVerb(ReadFollowFlags(in)); }},
    {"follows", [](const Invocation&) { return FollowsVerb(ReadConnectionFlags(), absl::GetFlag(FLAGS_json)); }},
    {"delete", [](const Invocation& in) {
       if (in.positional.size() == 1 && !in.positional[0].empty() && in.positional[0][0] == 'f') {
         return DeleteFollowVerb(ReadConnectionFlags(), in.positional[0]);
       }
       return DeleteVerb(ReadJobVerbFlags(in));
     }},
    {"report", [](const Invocation& in) { return ReportVerb(ReadJobVerbFlags(in)); }},
    {"compare", [](const Invocation& in) { return CompareVerb(ReadJobVerbFlags(in)); }},
    {"merge", [](const Invocation& in) { return MergeVerb(ReadJobVerbFlags(in)); }},
    {"verify", [](const Invocation& in) { return VerifyVerb({in.positional}); }},
    {"export", [](const Invocation& in) {
       return ExportVerb({in.positional, absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_out),
                          absl::GetFlag(FLAGS_input_size), absl::GetFlag(FLAGS_batch_size),
                          absl::GetFlag(FLAGS_precision), absl::GetFlag(FLAGS_python), absl::GetFlag(FLAGS_cxx),
                          in.model_options});
     }},
    {"slices", [](const Invocation& in) {
       return SlicesVerb({in.positional, ReadConnectionFlags(), absl::GetFlag(FLAGS_manifest), absl::GetFlag(FLAGS_slice_metric),
                          absl::GetFlag(FLAGS_slice_bins), absl::GetFlag(FLAGS_json)});
     }},
    {"store", [](const Invocation& in) {
       return StoreVerb({in.positional, absl::GetFlag(FLAGS_max_bytes), absl::GetFlag(FLAGS_json), absl::GetFlag(FLAGS_out)});
     }},
};

// Help and the version, answered before anything is parsed. Returns -1 when neither was asked for.
int HelpOrVersion(const CommandLine& cl) {
  if (cl.version || cl.verb == "version") {
    std::cout << VersionText();
    return 0;
  }
  if (cl.help || cl.verb == "help") {
    const std::string topic = cl.help ? cl.verb : (cl.positional.empty() ? "" : cl.positional[0]);
    const Verb* verb = FindVerb(topic);
    std::cout << (verb != nullptr && topic != "help" ? VerbHelp(*verb) : GeneralHelp());
    return 0;
  }
  return -1;
}

}  // namespace
}  // namespace tally

int main(int argc, char** argv) {
  tally::KeepGrpcUntilExit();  // Exits do not wait on gRPC's threads (common/job/rpc.h).
  absl::SetProgramUsageMessage("tally VERB [flags]; `tally help` lists the verbs");
  std::vector<std::string> normalized = tally::NormalizeFlagNames(argc, argv);
  // --channels-last was a bare boolean before it took auto|on|off: a bare one still means on.
  for (size_t i = 1; i < normalized.size() && normalized[i] != "--"; ++i) {
    if (normalized[i] != "--channels_last") continue;
    if (i + 1 == normalized.size() || absl::StartsWith(normalized[i + 1], "-")) normalized[i] = "--channels_last=on";
  }
  // Before Abseil sees argv: help, the version, and flags the verb does not take (exit 2).
  const tally::CommandLine cl = tally::CheckCommandLine(normalized);
  const std::string verb = tally::FindVerb(cl.verb) != nullptr ? cl.verb : "";
  if (const int rc = tally::HelpOrVersion(cl); rc >= 0) return rc;
  if (!cl.error.empty()) return tally::UsageError(verb, cl.error);
  if (cl.verb.empty()) {
    std::cerr << tally::GeneralHelp();
    return tally::kExitUsage;
  }
  tally::Invocation in;
  in.positional = cl.positional;
  in.model_options = tally::TakeRepeatedFlag(&normalized, "model_option");
  in.labels = tally::TakeRepeatedFlag(&normalized, "label");
  std::vector<char*> args = tally::ArgvPointers(normalized);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  for (const tally::Handler& h : tally::kHandlers) {
    if (cl.verb == h.verb) return h.run(in);
  }
  return tally::UsageError(verb, "internal: unhandled verb");
}
