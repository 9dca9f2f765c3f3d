// A trainer's checkpoint folder as a follow sees it (server/follow/checkpoint_watch.h), against a
// fake trainer writing real files and a fake clock: a checkpoint written in chunks is ready only a
// settle after its last chunk, once; the trainer's marker makes one ready at once; one deleted
// before it settled is gone; a taken checkpoint keeps its bytes when the trainer rotates it away or
// replaces it or saves over it in place, and one that changed after it settled is not taken.
#include "server/follow/checkpoint_watch.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

std::string TempDir() {
  char tmpl[] = "/tmp/tally-watch-XXXXXX";
  return mkdtemp(tmpl);
}

void Append(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::app) << bytes;
}

std::string Read(const std::string& path) {
  absl::StatusOr<std::string> s = ReadFileToString(path);
  return s.ok() ? *s : "<none>";
}

std::vector<std::string> Names(const std::vector<CheckpointEvent>& events, CheckpointEvent::Kind kind) {
  std::vector<std::string> out;
  for (const CheckpointEvent& e : events) {
    if (e.kind == kind) out.push_back(e.name);
  }
  return out;
}

using Kind = CheckpointEvent::Kind;

TEST(CheckpointWatchTest, AFileWrittenInChunksIsReadyASettleAfterItsLastChunkAndOnce) {
  const std::string dir = TempDir();
  CheckpointWatchOptions o;
  o.folder = dir;
  o.settle_seconds = 30;
  absl::StatusOr<CheckpointWatch> w = CheckpointWatch::Create(o);
  ASSERT_TRUE(w.ok()) << w.status();
  Append(dir + "/ckpt-000100.pt", "part one,");
  Append(dir + "/notes.txt", "not a checkpoint");
  Append(dir + "/.ckpt-000200.pt", "a hidden temporary file");
  EXPECT_TRUE(w->Poll(0).empty());
  Append(dir + "/ckpt-000100.pt", "part two,");  // Written again at t = 20: settles from then.
  EXPECT_TRUE(w->Poll(20).empty());
  EXPECT_TRUE(w->Poll(45).empty());
  std::vector<CheckpointEvent> e = w->Poll(50);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].kind, Kind::kReady);
  EXPECT_EQ(e[0].step, 100);
  EXPECT_EQ(e[0].size, 18);
  EXPECT_FALSE(e[0].by_marker);
  EXPECT_TRUE(w->Poll(60).empty());  // Once.
  w->Settle("ckpt-000100.pt", 60);   // A load that failed: another settle.
  EXPECT_TRUE(w->Poll(80).empty());
  EXPECT_EQ(Names(w->Poll(90), Kind::kReady), std::vector<std::string>{"ckpt-000100.pt"});
  EXPECT_TRUE(RemoveTree(dir).ok());
}

TEST(CheckpointWatchTest, TheMarkerMakesOneReadyAtOnceAndADeletedOneIsGone) {
  const std::string dir = TempDir();
  CheckpointWatchOptions o;
  o.folder = dir;
  o.pattern = "model_*.ts";
  o.step_regex = "step_(\\d+)";
  o.ready_marker = "{}.done";
  absl::StatusOr<CheckpointWatch> w = CheckpointWatch::Create(o);
  ASSERT_TRUE(w.ok()) << w.status();
  Append(dir + "/model_step_20_epoch3.ts", "b");
  Append(dir + "/model_step_7_epoch1.ts", "a");
  Append(dir + "/model_step_9_epoch2.ts", "c");
  EXPECT_TRUE(w->Poll(0).empty());
  Append(dir + "/model_step_20_epoch3.ts.done", "");
  Append(dir + "/model_step_7_epoch1.ts.done", "");
  unlink((dir + "/model_step_9_epoch2.ts").c_str());  // Rotated away before it settled.
  std::vector<CheckpointEvent> e = w->Poll(1);
  ASSERT_EQ(e.size(), 3u);
  // Ready ones by step, then the gone one.
  EXPECT_EQ(e[0].name, "model_step_7_epoch1.ts");
  EXPECT_EQ(e[0].step, 7);
  EXPECT_TRUE(e[0].by_marker);
  EXPECT_EQ(e[1].step, 20);
  EXPECT_EQ(e[2].kind, Kind::kGone);
  EXPECT_EQ(e[2].step, 9);
  EXPECT_TRUE(w->Poll(2).empty());  // Gone is said once.
  EXPECT_TRUE(RemoveTree(dir).ok());
}

TEST(CheckpointWatchTest, StepsComeFromTheRegexGroupOrTheLastDigits) {
  CheckpointWatchOptions o;
  absl::StatusOr<CheckpointWatch> w = CheckpointWatch::Create(o);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->StepOf("ckpt-000120.pt"), 120);
  EXPECT_EQ(w->StepOf("epoch3-step4500.pt"), 4500);
  EXPECT_EQ(w->StepOf("last.pt"), -1);
  o.step_regex = "epoch(\\d+)";
  w = CheckpointWatch::Create(o);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->StepOf("epoch3-step4500.pt"), 3);
  o.step_regex = "step_\\d+";  // No group.
  EXPECT_TRUE(absl::IsInvalidArgument(CheckpointWatch::Create(o).status()));
  o.step_regex = "step_(\\d+";
  EXPECT_TRUE(absl::IsInvalidArgument(CheckpointWatch::Create(o).status()));
}

TEST(CheckpointWatchTest, ATakenCheckpointKeepsItsBytesWhateverTheTrainerDoesNext) {
  const std::string dir = TempDir(), state = TempDir() + "/follow";
  CheckpointWatchOptions o;
  o.folder = dir;
  o.settle_seconds = 5;
  absl::StatusOr<CheckpointWatch> w = CheckpointWatch::Create(o);
  ASSERT_TRUE(w.ok());
  Append(dir + "/a-1.pt", "weights of step 1");
  Append(dir + "/a-2.pt", "weights of step 2");
  Append(dir + "/a-3.pt", "weights of step 3");
  w->Poll(0);
  std::vector<CheckpointEvent> ready = w->Poll(10);
  ASSERT_EQ(ready.size(), 3u);
  std::set<std::string> done;
  std::vector<TakenCheckpoint> taken;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<TakenCheckpoint> t = w->Take(ready[i], state, 10);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->path, state + "/" + std::to_string(i + 1) + "-a-" + std::to_string(i + 1) + ".pt");
    taken.push_back(*t);
    done.insert(ready[i].name);
  }
  unlink((dir + "/a-1.pt").c_str());  // Rotated away after it was taken.
  // Replaced after it was taken: a new file renamed over it.
  Append(dir + "/a-2.pt.tmp", "other weights");
  ASSERT_EQ(rename((dir + "/a-2.pt.tmp").c_str(), (dir + "/a-2.pt").c_str()), 0);
  // Written again after it settled, before it was taken: not taken, settles again.
  Append(dir + "/a-3.pt", " and more");
  absl::StatusOr<TakenCheckpoint> late = w->Take(ready[2], state, 11);
  EXPECT_TRUE(absl::IsUnavailable(late.status())) << late.status();
  EXPECT_EQ(Read(taken[0].path), "weights of step 1");
  EXPECT_EQ(Read(taken[1].path), "weights of step 2");
  // Taken ones are the manager's (`done`): neither gone nor ready again; a-3 is ready a settle on.
  EXPECT_TRUE(w->Poll(12, done).empty());
  std::vector<CheckpointEvent> again = w->Poll(17, done);
  ASSERT_EQ(Names(again, Kind::kReady), std::vector<std::string>{"a-3.pt"});
  absl::StatusOr<TakenCheckpoint> t = w->Take(again[0], state, 17);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(Read(t->path), "weights of step 3 and more");
  EXPECT_TRUE(RemoveTree(dir).ok());
  EXPECT_TRUE(RemoveTree(state.substr(0, state.rfind('/'))).ok());
}

TEST(CheckpointWatchTest, ACheckpointSavedOverInPlaceAfterItWasTakenKeepsItsTakenBytes) {
  // torch.save(obj, "ckpt.pt") truncates and rewrites the same file: a hard link would share the new
  // bytes (or the half-written ones).
  const std::string dir = TempDir(), state = TempDir() + "/follow";
  CheckpointWatchOptions o;
  o.folder = dir;
  o.settle_seconds = 1;
  absl::StatusOr<CheckpointWatch> w = CheckpointWatch::Create(o);
  ASSERT_TRUE(w.ok());
  Append(dir + "/last-7.pt", "weights of step 7");
  w->Poll(0);
  std::vector<CheckpointEvent> ready = w->Poll(2);
  ASSERT_EQ(ready.size(), 1u);
  absl::StatusOr<TakenCheckpoint> t = w->Take(ready[0], state, 2);
  ASSERT_TRUE(t.ok()) << t.status();
  const int fd = open((dir + "/last-7.pt").c_str(), O_WRONLY | O_TRUNC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "half", 4), 4);
  close(fd);
  EXPECT_EQ(Read(t->path), "weights of step 7");
  struct stat a, b;
  ASSERT_EQ(stat(t->path.c_str(), &a), 0);
  ASSERT_EQ(stat((dir + "/last-7.pt").c_str(), &b), 0);
  EXPECT_NE(a.st_ino, b.st_ino);
  EXPECT_TRUE(RemoveTree(dir).ok());
  EXPECT_TRUE(RemoveTree(state.substr(0, state.rfind('/'))).ok());
}

}  // namespace
}  // namespace tally
