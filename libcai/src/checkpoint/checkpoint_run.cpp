// Run identity and the directory lock: run records (run.json), claiming a run directory,
// DirLock and the checkpoint hook (split from checkpoint.cpp).
#include "cai/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <sstream>

#include "cai/core/error.h"
#include "cai/core/log.h"
#include "cai/core/version.h"
#include "cai/nn/module.h"
#include "cai/nn/tensor_parallel.h"
#include "checkpoint_internal.h"

namespace cai::checkpoint {

namespace fs = std::filesystem;

using detail::kRunRecord;
using detail::path_exists;
using detail::read_json;
using detail::step_run_id;
using detail::write_atomically;

// --- Run identity ------------------------------------------------------------------------------

namespace {

std::string utc_time(const char* format) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, format, &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

nlohmann::json to_json(const RunRecord& r) {
  nlohmann::json resumed = nlohmann::json::array();
  for (const RunRecord::Resume& x : r.resumed)
    resumed.push_back({{"time", x.time},
                       {"checkpoint", x.checkpoint},
                       {"config_hash", x.config_hash},
                       {"layout", x.layout}});
  return {{"format", "colossalai-cpp run 1"},
          {"run_id", r.run_id},
          {"config_hash", r.config_hash},
          {"seed", r.seed},
          {"model", r.model},
          {"world_size", r.world_size},
          {"dp", r.dp},
          {"pp", r.pp},
          {"tp", r.tp},
          {"zero_stage", r.zero_stage},
          {"layout", r.layout},
          {"started", r.started},
          {"host", r.host},
          {"pid", r.pid},
          {"resumed", resumed}};
}

// Names of DIR's entries that are or were checkpoints: step-<N>, step-<N>.tmp, ... (sorted).
std::vector<std::string> step_entries(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.rfind("step-", 0) == 0) out.push_back(n);
  }
  CAI_CHECK(!ec, "[checkpoint] cannot list {}: {}", dir, ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

std::string list_names(const std::vector<std::string>& names) {
  const size_t shown = std::min<size_t>(names.size(), 4);
  std::string out = fmt::format("{}", fmt::join(names.begin(), names.begin() + shown, ", "));
  if (names.size() > shown) out += fmt::format(" and {} more", names.size() - shown);
  return out;
}

}  // namespace

std::string utc_now() {
  return utc_time("%Y-%m-%dT%H:%M:%SZ");
}

std::string new_run_id() {
  std::random_device rd;
  const uint64_t r = (uint64_t{rd()} << 32) ^ rd();
  return fmt::format("{}-{:016x}", utc_time("%Y%m%dT%H%M%SZ"), r);
}

std::string text_hash(const std::string& text) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return fmt::format("{:016x}", h);
}

std::string describe(const RunRecord& r) {
  return fmt::format(
      "run {} (model {}, seed {}, config hash {}, {} process{}: {}, ZeRO {}; started {} on host "
      "{})",
      r.run_id, r.model.empty() ? "unnamed" : r.model, r.seed, r.config_hash, r.world_size,
      r.world_size == 1 ? "" : "es",
      r.layout.empty() ? fmt::format("dp {} × pp {} × tp {}", r.dp, r.pp, r.tp) : r.layout,
      r.zero_stage, r.started, r.host.empty() ? "unknown" : r.host);
}

std::optional<RunRecord> read_run_record(const std::string& dir) {
  const std::string path = dir + "/" + kRunRecord;
  if (!path_exists(path)) return std::nullopt;
  const nlohmann::json j = read_json(path);
  RunRecord r;
  try {
    r.run_id = j.at("run_id").get<std::string>();
    r.config_hash = j.value("config_hash", "");
    r.seed = j.value("seed", int64_t{0});
    r.model = j.value("model", "");
    r.world_size = j.value("world_size", 1);
    r.dp = j.value("dp", 1);
    r.pp = j.value("pp", 1);
    r.tp = j.value("tp", 1);
    r.zero_stage = j.value("zero_stage", 0);
    r.layout = j.value("layout", "");
    r.started = j.value("started", "");
    r.host = j.value("host", "");
    r.pid = j.value("pid", int64_t{0});
    for (const auto& x : j.value("resumed", nlohmann::json::array()))
      r.resumed.push_back({x.value("time", ""), x.value("checkpoint", ""),
                           x.value("config_hash", ""), x.value("layout", "")});
  } catch (const nlohmann::json::exception& e) {
    fail("[checkpoint] {}: not a run record ({})", path, e.what());
  }
  CAI_CHECK(!r.run_id.empty(), "[checkpoint] {}: empty run_id", path);
  return r;
}

RunRecord claim_run_dir(const std::string& dir, RunRecord run, const std::string& resume_from,
                        bool overwrite) {
  CAI_CHECK(!dir.empty(), "[checkpoint] no checkpoint.dir");
  CAI_CHECK(!run.run_id.empty(), "[checkpoint] a run record needs a run id");
  if (run.started.empty()) run.started = utc_now();
  if (run.host.empty()) run.host = host_name();
  if (run.pid == 0) run.pid = ::getpid();
  std::error_code ec;
  fs::create_directories(dir, ec);
  CAI_CHECK(!ec, "[checkpoint] cannot create {}: {}", dir, ec.message());
  const std::string record_path = dir + "/" + kRunRecord;
  const std::optional<RunRecord> owner = read_run_record(dir);
  const std::vector<std::string> steps = step_entries(dir);
  if (!resume_from.empty()) {
    const std::string ck = resolve_checkpoint(resume_from);
    const std::optional<std::string> ck_run = step_run_id(ck);
    const RunRecord::Resume entry{utc_now(), ck, run.config_hash, run.layout};
    std::error_code eq;
    const bool inside = fs::equivalent(fs::path(ck).parent_path(), dir, eq);
    if (inside || (owner && ck_run && owner->run_id == *ck_run)) {
      // The directory's own run goes on (a directory written before run records is adopted).
      RunRecord r = owner ? *owner : run;
      if (!owner && ck_run && !ck_run->empty()) r.run_id = *ck_run;
      r.resumed.push_back(entry);
      write_atomically(record_path, to_json(r).dump(1) + "\n");
      return r;
    }
    // The resumed run goes on in another directory.
    if (ck_run && !ck_run->empty()) run.run_id = *ck_run;
    run.resumed.push_back(entry);
  }
  // A record without any step entry is of a run that ended before its first save (an error at
  // start, Ctrl-C in its first epoch): nothing to lose, so the new run takes its place.
  if (owner && steps.empty())
    log::info("[checkpoint] {}: replacing the record of run {}, which saved no checkpoint there",
              dir, owner->run_id);
  if (!steps.empty()) {
    const std::string theirs = owner ? describe(*owner) + "; its checkpoints: " + list_names(steps)
                                     : "a run without a run record (" + list_names(steps) +
                                           "; written before run records, or by hand)";
    CAI_CHECK(
        overwrite,
        "[checkpoint] {} belongs to another run: {}. This run: {}{}. To go on: --resume "
        "continues that run; another checkpoint.dir keeps both; checkpoint.overwrite = true "
        "replaces that run (deletes its step directories)",
        dir, theirs, describe(run),
        resume_from.empty() ? "" : fmt::format(", resuming {}", run.resumed.back().checkpoint));
    for (const std::string& n : steps) {
      fs::remove_all(fs::path(dir) / n, ec);
      CAI_CHECK(!ec, "[checkpoint] checkpoint.overwrite: cannot remove {}/{}: {}", dir, n,
                ec.message());
    }
    for (const char* n : {"latest", "latest.tmp"}) {
      fs::remove(fs::path(dir) / n, ec);
      CAI_CHECK(!ec, "[checkpoint] checkpoint.overwrite: cannot remove {}/{}: {}", dir, n,
                ec.message());
    }
    log::info("[checkpoint] checkpoint.overwrite: deleted {} from {} ({})",
              owner ? "run " + owner->run_id : std::string("a run without a record"), dir,
              steps.empty() ? std::string("no checkpoints") : list_names(steps));
  }
  write_atomically(record_path, to_json(run).dump(1) + "\n");
  return run;
}

DirLock::DirLock(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  CAI_CHECK(!ec, "[checkpoint] cannot create {}: {}", dir, ec.message());
  const std::string path = dir + "/.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  CAI_CHECK(fd >= 0, "[checkpoint] cannot open {}: {}", path, std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[512] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    ::close(fd);
    std::string holder(buf, n > 0 ? static_cast<size_t>(n) : 0);
    holder.erase(holder.find_last_not_of(" \n\r\t") + 1);
    CAI_CHECK(err == EWOULDBLOCK, "[checkpoint] cannot lock {}: {}", path, std::strerror(err));
    fail(
        "[checkpoint] {} is in use by another job: {} is held by {}. Wait for that job to end, or "
        "give this run another checkpoint.dir",
        dir, path, holder.empty() ? "a process that has not written its pid yet" : holder);
  }
  const std::string text =
      fmt::format("pid {} on host {} since {}\n", ::getpid(), host_name(), utc_now());
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    const int err = errno;
    ::close(fd);
    fail("[checkpoint] cannot write {}: {}", path, std::strerror(err));
  }
  fd_ = fd;
}

DirLock::~DirLock() {
  release();
}

DirLock::DirLock(DirLock&& o) noexcept : fd_(o.fd_) {
  o.fd_ = -1;
}

DirLock& DirLock::operator=(DirLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void DirLock::release() {
  if (fd_ < 0) return;
  // Emptied (no holder to name), then released; a killed job's lock goes with its process.
  [[maybe_unused]] const int r = ::ftruncate(fd_, 0);
  ::close(fd_);
  fd_ = -1;
}

CheckpointHook::CheckpointHook(CheckpointConfig cfg, optim::LRScheduler* scheduler)
    : cfg_(std::move(cfg)), scheduler_(scheduler) {
  CAI_CHECK(cfg_.every_steps >= 0 && cfg_.every_epochs >= 0 && cfg_.keep_last >= 0,
            "[checkpoint] every_steps {}, every_epochs {} and keep_last {} must be >= 0",
            cfg_.every_steps, cfg_.every_epochs, cfg_.keep_last);
}

void CheckpointHook::after_step(train::Trainer& t, const train::StepInfo& s) {
  if (cfg_.every_steps <= 0 || s.global_step % cfg_.every_steps != 0) return;
  // An epoch's last step is saved by after_epoch, after the epoch's evaluation and its LR step.
  if (s.step_in_epoch >= s.steps_per_epoch) return;
  TrainingState st;
  st.epoch = s.epoch;
  st.step_in_epoch = s.step_in_epoch;
  st.global_step = s.global_step;
  save(t, st);
}

void CheckpointHook::after_epoch(train::Trainer& t, const train::EpochInfo& e) {
  const bool by_epoch = cfg_.every_epochs > 0 && (e.epoch + 1) % cfg_.every_epochs == 0;
  const bool by_step = cfg_.every_steps > 0 && e.global_step % cfg_.every_steps == 0;
  if (!by_epoch && !by_step) return;
  TrainingState st;
  st.epoch = e.epoch + 1;
  st.step_in_epoch = 0;
  st.global_step = e.global_step;
  save(t, st);
}

void CheckpointHook::on_stop(train::Trainer& t, const train::StopPoint& p) {
  if (last_step_ == p.global_step) return;  // this boundary's regular save
  TrainingState st;
  st.epoch = p.epoch;
  st.step_in_epoch = p.step_in_epoch;
  st.global_step = p.global_step;
  save(t, st);
}

void CheckpointHook::save(train::Trainer& t, const TrainingState& st) {
  last_path_ = save_checkpoint(cfg_, t, scheduler_, st);
  last_step_ = st.global_step;
}

}  // namespace cai::checkpoint
