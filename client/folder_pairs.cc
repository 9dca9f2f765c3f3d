#include "client/folder_pairs.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <iostream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/file_util.h"
#include "common/io/manifest.h"

namespace tally {
namespace {

absl::StatusOr<std::vector<std::string>> FilesEndingIn(const std::string& dir, const std::string& ending,
                                                       const char* what) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat("cannot read the ", what, " folder '", dir, "'"));
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.empty() || name[0] == '.' || !absl::EndsWith(name, ending)) continue;
    struct stat st;
    if (stat((dir + "/" + name).c_str(), &st) == 0 && S_ISREG(st.st_mode)) names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

absl::StatusOr<FolderPairs> ListPairs(const std::string& predictions, const std::string& references,
                                      const std::string& file_ending) {
  if (file_ending.empty()) return absl::InvalidArgumentError("--file-ending must not be empty");
  absl::StatusOr<std::vector<std::string>> preds = FilesEndingIn(predictions, file_ending, "predictions");
  if (!preds.ok()) return preds.status();
  absl::StatusOr<std::vector<std::string>> refs = FilesEndingIn(references, file_ending, "references");
  if (!refs.ok()) return refs.status();
  FolderPairs p;
  std::set_intersection(refs->begin(), refs->end(), preds->begin(), preds->end(), std::back_inserter(p.names));
  std::set_difference(refs->begin(), refs->end(), preds->begin(), preds->end(), std::back_inserter(p.only_references));
  std::set_difference(preds->begin(), preds->end(), refs->begin(), refs->end(),
                      std::back_inserter(p.only_predictions));
  return p;
}

absl::StatusOr<std::string> PairFolders(const std::string& predictions, const std::string& references,
                                        const std::string& file_ending, const std::string& state_dir,
                                        std::vector<std::string>* warnings) {
  const std::string pred_dir = AbsolutePath(predictions), ref_dir = AbsolutePath(references);
  absl::StatusOr<FolderPairs> p = ListPairs(pred_dir, ref_dir, file_ending);
  if (!p.ok()) return p.status();
  if (!p->only_references.empty()) {  // A missing prediction is the model's failure: nnU-Net refuses too.
    return absl::FailedPreconditionError(absl::StrCat(
        p->only_references.size(), " reference(s) in '", ref_dir, "' have no prediction in '", pred_dir,
        "': ", ListNames(p->only_references, 20)));
  }
  if (!p->only_predictions.empty()) {
    warnings->push_back(absl::StrCat(p->only_predictions.size(), " prediction(s) in '", pred_dir,
                                     "' have no reference in '", ref_dir,
                                     "' and are not evaluated: ", ListNames(p->only_predictions, 20)));
  }
  for (const std::string& w : *warnings) std::cerr << "tally: " << w << "\n";
  if (p->names.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("no files ending in '", file_ending, "' in '", ref_dir,
                                                      "' (--file-ending)"));
  }
  std::string csv = "id,mask,prediction\n";
  for (const std::string& name : p->names) {
    const std::string id = name.substr(0, name.size() - file_ending.size());
    absl::StrAppend(&csv, CsvField(id), ",", CsvField(ref_dir + "/" + name), ",", CsvField(pred_dir + "/" + name),
                    "\n");
  }
  if (absl::Status s = MakeDirs(state_dir); !s.ok()) return s;
  const std::string path = state_dir + "/pairs.csv";
  if (absl::Status s = WriteFileAtomically(path, csv); !s.ok()) return s;
  std::cerr << "tally: " << p->names.size() << " prediction/reference pairs\n";
  return path;
}

}  // namespace tally
