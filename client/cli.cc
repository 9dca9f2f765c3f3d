#include "client/cli.h"

#include <algorithm>
#include <set>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "base/build_info.h"

namespace tally {
namespace {

const std::vector<std::string> kConnection = {"server", "token_file", "tls_ca", "tls_cert", "tls_key",
                                              "tls_server_name"};
const std::vector<std::string> kJob = {
    "model", "manifest", "name", "label", "metrics", "batch_size", "shard_size", "mean", "std", "input_size",
    "spacing", "force_spacing", "num_classes", "regions", "nnunet_summary", "nsd_tolerance", "include_background",
    "precision", "channels_last", "decode", "max_memory", "max_image_pixels", "batch_timeout", "nonfinite", "ignore_index",
    "label_map", "python", "model_option", "thresholds", "empty_score", "iou_thresholds", "max_failed_fraction",
    "json_infinity", "thumbnails", "save_predictions", "prediction_store", "store_max_bytes", "coco", "images", "masks", "mask_suffix", "shards", "image_ext", "mask_ext", "prediction_ext", "coco_results", "coco_panoptic", "panoptic_dir",
    "panoptic_predictions", "panoptic_predictions_dir", "connectivity", "lesion_dilation", "lesion_min_volume",
    "lesion_max_hd95", "lesion_iou", "sliding_window", "overlap", "sw_batch_size", "intensity", "keep_dtype", "window", "order", "until_ci", "min_rows", "sample", "speculate_after", "canary", "priority", "compile", "group_by", "min_group_rows", "find_slices"};
const std::vector<std::string> kFollow = {"pattern", "step_regex", "settle", "ready_marker", "load_retries",
                                         "catch_up", "race", "race_margin", "follow_metric", "until_step", "idle",
                                         "on_new_best"};
const std::vector<std::string> kRun = {"out", "workers", "gpus", "gpus_per_worker", "lease_seconds",
                                       "count_logit_ties", "worker_threads", "worker_flags", "max_worker_memory",
                                       "predictions", "references", "file_ending"};

std::vector<std::string> Join(std::initializer_list<std::vector<std::string>> parts) {
  std::vector<std::string> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string Dashed(const std::string& flag) { return absl::StrReplaceAll(flag, {{"_", "-"}}); }

// The closest of `names` to `flag`, if it is close enough to be a typo.
std::string Closest(const std::string& flag, const std::vector<std::string>& names) {
  std::string best;
  size_t best_d = std::max<size_t>(2, flag.size() / 3) + 1;
  for (const std::string& n : names) {
    const size_t d = EditDistance(flag, n);
    if (d < best_d || (absl::StartsWith(n, flag) && flag.size() >= 3 && best.empty())) {
      best_d = std::min(d, best_d);
      best = n;
    }
  }
  return best;
}

bool IsBoolFlag(const std::string& name) {
  const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
  return f != nullptr && f->IsOfType<bool>();
}

// Flags every verb takes (repeatable ones are taken out of argv before absl sees them).
bool IsRepeatable(const std::string& name) { return name == "model_option" || name == "label"; }

}  // namespace

const std::vector<Verb>& Verbs() {
  static const std::vector<Verb>* verbs = new std::vector<Verb>{
      {"run", "--model M.pt|M.py --manifest data.csv --out DIR [--workers N | --gpus all|0,1]",
       "evaluate locally in one command (its own tallyd and workers); --follow DIR: every checkpoint of a training run",
       Join({kJob, kRun, kFollow, {"follow"}})},
      {"rescore", "JOB --server HOST:PORT | --from-store DIR --model M --manifest data.csv; --out DIR [flags] [--workers N]",
       "a new report from stored predictions alone: other metrics, ignore index, lesion rules; no model runs",
       Join({kConnection, kJob, {"out", "workers", "lease_seconds", "worker_threads", "worker_flags",
                                 "max_worker_memory", "from_store", "store_settings"}})},
      {"submit", "--server HOST:PORT --model M --manifest data.csv [job flags]", "submit a job; prints its id",
       Join({kConnection, kJob, {"json"}})},
      {"watch", "JOB [--timeout S]", "progress until the job ends", Join({kConnection, {"json", "timeout"}})},
      {"wait", "JOB... [--timeout S]", "wait for jobs to end; the exit code says how they ended",
       Join({kConnection, {"json", "timeout"}})},
      {"status", "JOB", "one job's state", Join({kConnection, {"json"}})},
      {"cancel", "JOB|FOLLOW", "cancel a job, or stop a follow (ids f...)", Join({kConnection, {"json"}})},
      {"follow", "DIR --manifest data.csv [job flags] [--pattern G] [--step-regex R] [--settle S] [--race on|off]",
       "evaluate each checkpoint of a training run as it lands, against the best so far; shows the curve as it grows",
       Join({kConnection, kJob, kFollow, {"detach", "json"}})},
      {"follows", "", "the follows tallyd keeps: state, checkpoints, best step", Join({kConnection, {"json"}})},
      {"report", "JOB --out DIR [--partial]", "fetch a finished job's report files (--partial: a running job's so far)",
       Join({kConnection, {"out", "partial"}})},
      {"jobs", "[--state S] [--label K=V] [--limit N] [--page-token JOB]", "list jobs, newest first",
       Join({kConnection, {"json", "limit", "page_token", "state", "label"}})},
      {"delete", "JOB|FOLLOW", "delete a finished job's rows, results and reports, or an ended follow's record", kConnection},
      {"compare", "A B --out DIR",
       "two runs of the same manifest, paired: differences B - A with intervals and p-values",
       Join({kConnection, {"out"}})},
      {"merge", "JOB JOB... --out DIR", "one report over several jobs' rows (a set evaluated as several jobs)",
       Join({kConnection, {"out"}})},
      {"health", "", "tallyd's gRPC health (exit 0: SERVING), as container health checks ask", kConnection},
      {"workers", "", "registered workers, their device, state and current jobs", Join({kConnection, {"json"}})},
      {"estimate", "--model M --manifest data.csv [--gpus 0|0,1|all] [--max-memory 0.8|20GiB] [--max-batch N]",
       "trial passes: peak memory and images/s per batch size, the largest that fits, the manifest's predicted time",
       Join({kJob, {"gpus", "gpus_per_worker", "workers", "worker_threads", "worker_flags", "max_batch", "json"}})},
      {"export", "--model net.pt|model.py[:Class] --input-size HxW --out net.pt2 [--batch-size 32] [--precision fp32|bf16|fp16] [--model-option K=V] [--python P] [--cxx g++]",
       "the network as an AOTInductor package (.pt2) that GPU workers load (torch 2.6+ in --python's interpreter)",
       {"model", "out", "input_size", "batch_size", "precision", "python", "cxx", "model_option"}},
      {"verify", "OUT",
       "read a finished job's files again: every row whose bytes differ now from what was scored (exit 1)", {}},
      {"slices", "OUT|JOB [--server ADDRESS] [--slice-metric dice|iou|dice:K] [--slice-bins 4] [--manifest M] [--json]",
       "failing slices of a finished report: manifest columns (and pairs) where the model scores lower, "
       "tested and corrected for the search",
       Join({kConnection, {"manifest", "slice_metric", "slice_bins", "json"}})},
      {"store", "stats|ls|export|gc DIR [--out D] [--max-bytes N] [--json]",
       "the prediction store: entries and bytes by model, every entry, every entry as a PNG, or drop the least "
       "recently used past N bytes",
       {"max_bytes", "json", "out"}},
      {"gpus", "[--json]",
       "this machine's GPUs: memory, processes, links, and whether each is ready (exit 0: one is)", {"json"}},
      {"token", "NAME client|worker|admin [--tokens-file F] [--out FILE]",
       "make a token and its line for tallyd --auth-tokens", {"tokens_file", "out"}},
      {"help", "[VERB]", "this help, or a verb's", {}},
      {"version", "", "version, LibTorch and CUDA it was built with, git revision", {}},
  };
  return *verbs;
}

const Verb* FindVerb(const std::string& name) {
  for (const Verb& v : Verbs()) {
    if (v.name == name) return &v;
  }
  return nullptr;
}

CommandLine CheckCommandLine(const std::vector<std::string>& args) {
  CommandLine out;
  std::vector<std::string> flags;  // Seen, in order.
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;
    if (a == "-h" || a == "--help" || a == "-help" || a == "--helpfull") {
      out.help = true;
      continue;
    }
    if (a == "--version" || a == "-version") {
      out.version = true;
      continue;
    }
    if (a.size() < 2 || a[0] != '-') {
      if (out.verb.empty()) {
        out.verb = a;
      } else {
        out.positional.push_back(a);
      }
      continue;
    }
    std::string name = a.substr(a[1] == '-' ? 2 : 1);
    const size_t eq = name.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) name = name.substr(0, eq);
    if (!has_value && absl::FindCommandLineFlag(name) == nullptr && absl::StartsWith(name, "no") &&
        IsBoolFlag(name.substr(2))) {
      name = name.substr(2);  // --noflag
    } else if (!has_value && !IsBoolFlag(name) && i + 1 < args.size()) {
      ++i;  // --flag value
    }
    flags.push_back(name);
  }
  if (out.help || out.version) return out;
  const Verb* verb = FindVerb(out.verb);
  if (verb == nullptr) {
    if (out.verb.empty()) return out;
    std::vector<std::string> names;
    for (const Verb& v : Verbs()) names.push_back(v.name);
    const std::string near = Closest(out.verb, names);
    out.error = absl::StrCat("unknown command '", out.verb, "'", near.empty() ? "" : "; did you mean '" + near + "'?");
    return out;
  }
  std::vector<std::string> all;
  for (const Verb& v : Verbs()) all.insert(all.end(), v.flags.begin(), v.flags.end());
  for (const std::string& f : flags) {
    if (std::find(verb->flags.begin(), verb->flags.end(), f) != verb->flags.end()) continue;
    if (absl::FindCommandLineFlag(f) == nullptr && !IsRepeatable(f)) {
      std::string near = Closest(f, verb->flags);
      if (near.empty()) near = Closest(f, all);
      out.error = absl::StrCat("unknown flag --", Dashed(f), near.empty() ? "" : "; did you mean --" + Dashed(near) + "?");
      return out;
    }
    std::vector<std::string> takers;
    for (const Verb& v : Verbs()) {
      if (std::find(v.flags.begin(), v.flags.end(), f) != v.flags.end()) takers.push_back(v.name);
    }
    const std::string near = Closest(f, verb->flags);
    out.error = absl::StrCat("tally ", verb->name, " does not take --", Dashed(f),
                             takers.empty() ? "" : " (a flag of: " + absl::StrJoin(takers, ", ") + ")",
                             near.empty() ? "" : "; did you mean --" + Dashed(near) + "?");
    return out;
  }
  return out;
}

std::string VerbHelp(const Verb& verb) {
  std::string out = absl::StrCat("Usage: tally ", verb.name, verb.synopsis.empty() ? "" : " " + verb.synopsis, "\n",
                                 verb.summary, "\n");
  if (!verb.flags.empty()) out += "\nFlags:\n";
  for (const std::string& name : verb.flags) {
    const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
    std::string help, def;
    if (f != nullptr) {
      help = f->Help();
      def = f->DefaultValue();
    } else if (name == "model_option") {
      help = "Python models: KEY=VALUE given to the model as options[KEY] (repeatable)";
    } else if (name == "label") {
      help = "KEY=VALUE stored with the job; tally jobs --label KEY=VALUE filters by it (repeatable)";
    }
    absl::StrAppend(&out, "  --", Dashed(name), "\n      ", help,
                    def.empty() || def == "\"\"" ? "" : absl::StrCat(" (default: ", def, ")"), "\n");
  }
  return out;
}

std::string GeneralHelp() {
  std::string out = "tally: evaluate segmentation models on many images, on every GPU.\n\nUsage: tally VERB [flags]\n\n";
  for (const Verb& v : Verbs()) absl::StrAppend(&out, "  ", v.name, std::string(9 - std::min<size_t>(8, v.name.size()), ' '), v.summary, "\n");
  out += "\n`tally VERB --help` lists a verb's flags. Flags accept dashes or underscores.\n";
  out += "Exit codes: 0 succeeded, 1 failed (or an error), 2 bad usage, 3 succeeded but more rows failed than\n"
         "--max-failed-fraction allows (default 0: any), 4 cancelled, 5 tallyd unreachable, 6 timed out (--timeout),\n"
         "130 interrupted. See docs/cli.md.\n";
  return out;
}

std::string VersionText() {
  return absl::StrCat("tally ", kTallyVersion, " (git ", kGitRevision, ")\nbuilt with LibTorch ", kTorchVersion,
                      ", CUDA ", kCudaVersion, "\n");
}

}  // namespace tally
