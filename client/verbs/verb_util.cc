#include "client/verbs/verb_util.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/backoff.h"
#include "client/progress.h"
#include "common/job/job_config.h"
#include "common/job/rpc.h"
#include "common/process/gpu_inventory.h"
#include "common/security/auth_tokens.h"

namespace tally {

int UsageError(const std::string& verb, const std::string& error) {
  std::cerr << "tally: " << error << "\n";
  std::cerr << (verb.empty() ? std::string("`tally help` lists the verbs") : "`tally " + verb + " --help` lists its flags")
            << "\n";
  return kExitUsage;
}

int Finish(const absl::Status& s) {
  if (s.ok()) return 0;
  std::cerr << "tally: " << s.message() << "\n";
  return absl::IsUnavailable(s) ? kExitUnreachable : kExitFailed;
}

absl::StatusOr<std::unique_ptr<TallyClient>> Connect(const ConnectionFlags& flags) {
  auto token = ReadToken(flags.token_file);
  if (!token.ok()) return token.status();
  ClientSecurityOptions security;
  security.tls_ca = flags.tls_ca;
  security.tls_cert = flags.tls_cert;
  security.tls_key = flags.tls_key;
  security.tls_server_name = flags.tls_server_name;
  security.token = *token;
  return TallyClient::Create(flags.server, security);
}

absl::StatusOr<std::string> ResolveJobId(TallyClient& client, const std::string& id) {
  absl::StatusOr<v1::Job> exact = client.Get(id);
  if (exact.ok() || !absl::IsNotFound(exact.status()) || id.empty()) {
    if (!exact.ok()) return exact.status();
    return id;
  }
  std::vector<std::string> matches;
  std::string token;
  do {
    auto page = client.List(1000, token);
    if (!page.ok()) return page.status();
    for (const auto& j : page->jobs()) {
      if (absl::StartsWith(j.job_id(), id)) matches.push_back(j.job_id());
    }
    token = page->next_page_token();
  } while (!token.empty());
  if (matches.size() == 1) return matches[0];
  if (matches.empty()) return exact.status();
  if (matches.size() > 5) matches.resize(5);
  return absl::InvalidArgumentError(absl::StrCat("job id prefix '", id, "' is ambiguous: ", absl::StrJoin(matches, ", "),
                                                 matches.size() == 5 ? ", ..." : ""));
}

absl::StatusOr<std::vector<std::string>> ResolveJobIds(TallyClient& client, const std::vector<std::string>& ids) {
  std::vector<std::string> out;
  for (const std::string& p : ids) {
    auto id = ResolveJobId(client, p);
    if (!id.ok()) return id.status();
    out.push_back(*id);
  }
  return out;
}

int ResolveJobIdsPatiently(TallyClient& client, const JobVerbFlags& f, const std::string& verb,
                           std::vector<std::string>* ids) {
  const absl::Time deadline = absl::Now() + absl::Seconds(f.timeout > 0 ? f.timeout : kUnreachableSeconds);
  Backoff backoff(0.25, 2.0);
  bool said = false;
  while (true) {
    absl::StatusOr<std::vector<std::string>> resolved = ResolveJobIds(client, f.jobs);
    if (resolved.ok()) {
      *ids = *std::move(resolved);
      return kExitSucceeded;
    }
    if (!absl::IsUnavailable(resolved.status())) return Finish(resolved.status());
    if (absl::Now() >= deadline) {
      if (f.timeout <= 0) return Finish(resolved.status());
      std::cerr << "tally " << verb << ": timed out after " << f.timeout << " s; tallyd did not answer\n";
      return kExitTimedOut;
    }
    if (!said) {
      std::cerr << "tally " << verb << ": " << resolved.status().message() << "; waiting for tallyd (restarting?)\n";
      said = true;
    }
    absl::SleepFor(std::min(absl::Seconds(backoff.Next()), std::max(absl::ZeroDuration(), deadline - absl::Now())));
  }
}

int SelectWorkerGpus(const std::string& verb, const LocalWorkerFlags& flags, const std::string& model,
                     std::vector<std::string>* groups) {
  if (flags.gpus.empty()) {
    return flags.gpus_per_worker != 1 ? UsageError(verb, "--gpus-per-worker goes with --gpus") : 0;
  }
  auto gpus = SelectGpus(flags.gpus);
  if (!gpus.ok()) return Finish(gpus.status());
  auto grouped = GroupGpus(*gpus, flags.gpus_per_worker);
  if (!grouped.ok()) return UsageError(verb, std::string(grouped.status().message()));
  if (flags.gpus_per_worker > 1 && !ParseModelRef(model).python) {
    return UsageError(verb,
                      "--gpus-per-worker > 1 needs a Python model (--model PATH.py): a TorchScript model runs on one GPU");
  }
  *groups = *std::move(grouped);
  return 0;
}

void PrintJob(const v1::Job& job) {
  std::cout << absl::StrFormat("%-28s %-10s %8d/%-8d %6d failed  %8.1f img/s  %s\n", job.job_id(),
                               JobStateName(job.state()), job.images_evaluated() + job.images_failed(),
                               job.images_total(), job.images_failed(), job.images_per_second(),
                               job.spec().model().empty() ? "(scoring predictions)" : job.spec().model());
  if (!job.error().empty()) std::cout << "  error: " << job.error() << "\n";
  if (!job.stalled().empty()) std::cout << "  " << job.stalled() << "\n";
  if (!IsTerminal(job.state())) {
    // Scheduling (README "Operating tallyd"): its workers and share, or its place and why it waits.
    std::cout << absl::StrFormat("  workers: %d on it (%.0f%% of those in service)", job.workers_assigned(),
                                 100 * job.running_share());
    if (job.spec().priority() != 0) std::cout << ", priority " << job.spec().priority();
    if (job.queue_position() > 0) std::cout << "; queue position " << job.queue_position();
    std::cout << "\n";
    if (!job.waiting().empty()) std::cout << "  waiting: " << job.waiting() << "\n";
  }
  if (job.images_held() > 0) {
    std::cout << "  held: " << job.images_held()
              << " more rows evaluated; their results wait for the layout trial (--channels-last auto)\n";
  }
  if (!job.sampled().empty()) std::cout << "  " << job.sampled() << "\n";
  if (!IsTerminal(job.state()) && job.live_size() > 0) {
    std::cout << "  live estimates (" << job.live_note() << "):\n";
    for (const v1::LiveEstimate& e : job.live()) {
      std::cout << absl::StrFormat("    class %-3d dice %s  iou %s  (%d row%s)%s\n", e.class_id(),
                                   WithInterval(e.dice_mean(), e.dice_ci_low(), e.dice_ci_high()),
                                   WithInterval(e.iou_mean(), e.iou_ci_low(), e.iou_ci_high()), e.rows(),
                                   e.rows() == 1 ? "" : "s",
                                   e.foreground() ? "" : "  (not in the foreground)");
    }
  }
  if (!job.until_ci_note().empty()) std::cout << "  " << job.until_ci_note() << "\n";
}

}  // namespace tally
