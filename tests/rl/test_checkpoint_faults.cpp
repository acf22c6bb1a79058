// tests/rl/test_checkpoint_faults.cpp — crash-safe checkpoints (rl/checkpoint.h) by fault
// injection: a run killed with SIGKILL at random points while it writes a checkpoint, and a disk
// that fills up while it does. Each time the previous checkpoint (or the new one, whole) must be
// found and load, and a resumed run must end with the same weights, bit for bit, as a run that was
// never interrupted.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "io/config.h"
#include "io/file_io.h"
#include "io/safetensors.h"
#include "model/hf_checkpoint.h"
#include "rl/checkpoint.h"
#include "rl/train.h"
#include "tests/rl/rl_test_util.h"
#include "tests/test_util.h"

namespace lockstep {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

// Per process: ctest runs this binary's tests as processes side by side (-j), and each would
// otherwise remove the other's folders.
std::string own_folder_prefix() { return "lockstep_test_checkpoint_faults_" + std::to_string(::getpid()) + "_"; }

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / (own_folder_prefix() + name);
  fs::remove_all(dir);
  return dir;
}

// After all of this process's tests have passed, its folders go (a failure keeps them to look at).
// Only the test process gets here: the forked children end with _Exit.
class RemoveOwnFolders : public ::testing::Environment {
 public:
  void TearDown() override {
    if (!::testing::UnitTest::GetInstance()->Passed()) return;
    const std::string prefix = own_folder_prefix();
    std::vector<fs::path> own;
    for (const auto& entry : fs::directory_iterator(fs::temp_directory_path()))
      if (entry.path().filename().string().starts_with(prefix)) own.push_back(entry.path());
    for (const fs::path& dir : own) fs::remove_all(dir);
  }
};
[[maybe_unused]] ::testing::Environment* const remove_own_folders =
    ::testing::AddGlobalTestEnvironment(new RemoveOwnFolders);

// Three GRPO steps of the builtin model, a checkpoint after each.
Config tiny_run(const fs::path& dir) {
  Config c = testing::tiny_grpo_run(dir);
  c.run.checkpoint_every = 1;
  return c;
}

// Every weight's bytes, by name.
using WeightBytes = std::map<std::string, std::string>;
WeightBytes bytes_of(const ModelParameters& params) {
  WeightBytes out;
  params.for_each([&](const std::string& name, const Tensor& t) {
    out[name] = std::string(static_cast<const char*>(t.data()), t.nbytes());
  });
  return out;
}

// The weights after each step (1-based) of an uninterrupted run.
std::map<int64_t, WeightBytes> reference_weights() {
  static const std::map<int64_t, WeightBytes> weights = [] {
    std::map<int64_t, WeightBytes> out;
    run_train(tiny_run(fresh_dir("reference")),
              {.stop_after = {}, .before_optimizer_step = {},
               .after_step = [&](int64_t step, const ModelParameters& p) { out[step] = bytes_of(p); }});
    return out;
  }();
  return weights;
}

// The weights a resumed run of `c` ends with.
WeightBytes resume_to_the_end(Config c) {
  c.run.resume = true;
  WeightBytes last;
  run_train(c, {.stop_after = {}, .before_optimizer_step = {},
                .after_step = [&](int64_t step, const ModelParameters& p) {
                  if (step == c.run.steps) last = bytes_of(p);
                }});
  return last;
}

// The checkpoint in `dir` loads, and its weights are those of the reference run at its step.
// Returns that step.
int64_t expect_whole_checkpoint(const fs::path& dir) {
  const std::optional<SavedRun> saved = find_checkpoint(dir);
  if (!saved) {
    ADD_FAILURE() << "no checkpoint in " << dir;
    return -1;
  }
  const ModelConfig config = load_model_config(saved->model.string());
  // (EXPECT_TRUE, not EXPECT_EQ: a failure would print every weight's bytes.)
  EXPECT_TRUE(bytes_of(load_hf_parameters(config, saved->model.string())) == reference_weights().at(saved->state.step))
      << "the checkpoint of step " << saved->state.step << " does not hold that step's weights";
  const SafetensorsFile optimizer((dir / "checkpoint" / "optimizer.safetensors").string());
  EXPECT_GT(optimizer.size(), 0u);
  return saved->state.step;
}

void write_byte(int fd) {
  const char byte = 1;
  if (::write(fd, &byte, 1) != 1) std::_Exit(3);
}

// A child process resuming the run in `dir` from step 1; it writes a byte to `signal_fd` just before
// the checkpoint of step 2 is written (after_step) and one just after (stop_after).
pid_t start_resumed_child(const Config& c, int signal_fd) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  try {
    Config resumed = c;
    resumed.run.resume = true;
    run_train(resumed, {.stop_after = [&](int64_t step) {
                          if (step == 2) write_byte(signal_fd);
                          return false;
                        },
                        .before_optimizer_step = {},
                        .after_step = [&](int64_t step, const ModelParameters&) {
                          if (step == 2) write_byte(signal_fd);
                        }});
  } catch (...) {
    std::_Exit(2);
  }
  std::_Exit(0);
}

void read_byte(int fd) {
  char byte = 0;
  ASSERT_EQ(::read(fd, &byte, 1), 1) << "the child ended before it signalled";
}

TEST(CheckpointFaults, KilledWhileWritingLeavesAWholeCheckpointAndAnExactResume) {
  const WeightBytes expected_end = reference_weights().at(3);
  // How long the child takes to write the checkpoint of step 2, to spread the kills over it.
  const fs::path timing_dir = fresh_dir("timing");
  Config timing = tiny_run(timing_dir);
  ASSERT_TRUE(run_train(timing, {.stop_after = [](int64_t step) { return step == 1; },
                                 .before_optimizer_step = {}, .after_step = {}})
                  .interrupted);
  double save_seconds = 0;
  {
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = start_resumed_child(timing, fds[1]);
    ::close(fds[1]);
    read_byte(fds[0]);
    const auto begin = std::chrono::steady_clock::now();
    read_byte(fds[0]);
    save_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(fds[0]);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
    EXPECT_EQ(expect_whole_checkpoint(timing_dir), 3);
  }

  // Kill points: LOCKSTEP_KILL_POINTS (default 8), uniform over the save and a little after, seeded.
  const char* env = std::getenv("LOCKSTEP_KILL_POINTS");
  const int kill_points = env ? std::atoi(env) : 8;
  std::mt19937_64 random(20261128);
  std::uniform_real_distribution<double> delay(0, save_seconds * 1.5);  // some land after it
  int old_found = 0, new_found = 0, half_written_left = 0;  // counts, printed at the end
  for (int k = 0; k < kill_points; ++k) {
    const fs::path dir = fresh_dir("kill");
    const Config c = tiny_run(dir);
    ASSERT_TRUE(run_train(c, {.stop_after = [](int64_t step) { return step == 1; },
                              .before_optimizer_step = {}, .after_step = {}})
                    .interrupted);
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    const pid_t pid = start_resumed_child(c, fds[1]);
    ::close(fds[1]);
    read_byte(fds[0]);
    std::this_thread::sleep_for(std::chrono::duration<double>(delay(random)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(fds[0]);
    half_written_left += fs::exists(dir / "checkpoint.tmp");
    // Step 1: killed before the exchange; 2: after it; 3: after the child's last step (the kill
    // came late). Each checkpoint must hold the reference run's weights of its step.
    const int64_t step = expect_whole_checkpoint(dir);
    EXPECT_TRUE(step >= 1 && step <= 3) << "kill point " << k << ": step " << step;
    (step == 1 ? old_found : new_found)++;
    if (step < 3) {
      EXPECT_TRUE(resume_to_the_end(c) == expected_end) << "kill point " << k << ": the resumed run differs";
      EXPECT_EQ(expect_whole_checkpoint(dir), 3);
    }
  }
  std::printf("%d kill points over %.1f ms of checkpoint writing: %d found the previous checkpoint, "
              "%d a newer one; %d left a checkpoint.tmp behind (half written, or the old one being "
              "removed)\n",
              kill_points, save_seconds * 1e3, old_found, new_found, half_written_left);
}

TEST(CheckpointFaults, AnInterruptedFolderSwapIsRecovered) {
  // replace_folder's fallback (a file system without RENAME_EXCHANGE) moves the old checkpoint aside
  // before renaming the new one in; a crash between the two renames leaves no `checkpoint`, only
  // `checkpoint.old` (whole) and `checkpoint.tmp`. That state, made by hand: the old one is found.
  const fs::path dir = fresh_dir("swap");
  const Config c = tiny_run(dir);
  ASSERT_TRUE(run_train(c, {.stop_after = [](int64_t step) { return step == 1; },
                            .before_optimizer_step = {}, .after_step = {}})
                  .interrupted);
  fs::copy(dir / "checkpoint", dir / "checkpoint.tmp", fs::copy_options::recursive);
  fs::rename(dir / "checkpoint", dir / "checkpoint.old");
  EXPECT_EQ(expect_whole_checkpoint(dir), 1);
  EXPECT_TRUE(fs::exists(dir / "checkpoint" / "state.json"));
  EXPECT_FALSE(fs::exists(dir / "checkpoint.old"));
  EXPECT_TRUE(resume_to_the_end(c) == reference_weights().at(3));
}

// Every file under `dir` with its bytes.
std::map<std::string, std::string> files_under(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.is_regular_file()) out[fs::relative(entry.path(), dir).string()] = read_file(entry.path().string(), "file");
  return out;
}

// A tmpfs mounted for the test's lifetime (root, or a user namespace, can mount one).
struct Tmpfs {
  fs::path dir;
  bool mounted = false;
  explicit Tmpfs(const fs::path& where) : dir(where) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=64m") == 0;
  }
  bool resize(uint64_t bytes) {
    return ::mount("tmpfs", dir.c_str(), "tmpfs", MS_REMOUNT, ("size=" + std::to_string(bytes)).c_str()) == 0;
  }
  uint64_t used_bytes() const {
    struct statvfs s {};
    ::statvfs(dir.c_str(), &s);
    return uint64_t(s.f_blocks - s.f_bfree) * s.f_frsize;
  }
  ~Tmpfs() {
    if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
  }
};

TEST(CheckpointFaults, AFullDiskIsOneClearErrorAndKeepsThePreviousCheckpoint) {
  Tmpfs disk(fresh_dir("tmpfs"));
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << "): needs root";
  const Config c = tiny_run(disk.dir / "run");
  ASSERT_TRUE(run_train(c, {.stop_after = [](int64_t step) { return step == 1; },
                            .before_optimizer_step = {}, .after_step = {}})
                  .interrupted);
  const auto before = files_under(disk.dir / "run" / "checkpoint");
  uint64_t checkpoint_bytes = 0;
  for (const auto& [name, bytes] : before) checkpoint_bytes += bytes.size();
  // Room for half a checkpoint more: the next one cannot be written beside the previous one.
  ASSERT_TRUE(disk.resize(disk.used_bytes() + checkpoint_bytes / 2)) << std::strerror(errno);
  Config resumed = c;
  resumed.run.resume = true;
  expect_error([&] { run_train(resumed); },
               {"cannot save the checkpoint", (disk.dir / "run" / "checkpoint.tmp").string(),
                "No space left on device"});
  EXPECT_TRUE(files_under(disk.dir / "run" / "checkpoint") == before) << "the previous checkpoint changed";
  EXPECT_FALSE(fs::exists(disk.dir / "run" / "checkpoint.tmp")) << "a half-written checkpoint was left";
  EXPECT_EQ(expect_whole_checkpoint(disk.dir / "run"), 1);
  // With room again the run resumes from that checkpoint and ends as the uninterrupted run.
  ASSERT_TRUE(disk.resize(64 << 20)) << std::strerror(errno);
  EXPECT_TRUE(resume_to_the_end(c) == reference_weights().at(3));
}

}  // namespace
}  // namespace lockstep
