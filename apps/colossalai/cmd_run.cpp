#include "cmd_run.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "../cli_checks.h"
#include "cai/checkpoint/checkpoint.h"
#include "cai/config/config.h"
#include "cai/core/error.h"
#include "run_internal.h"
#include "run_preempt.h"

extern char** environ;

namespace cai::app {

using namespace detail;

namespace detail {

const char* const kWrapperCommand = "_rank_wrapper";

bool parse_int(const std::string& s, long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (errno || !end || *end) return false;
  *out = v;
  return true;
}

std::vector<char*> c_argv(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    p += w, n -= static_cast<size_t>(w);
  }
}

void say(const std::string& msg) {
  const std::string line = msg + "\n";
  write_all(2, line.data(), line.size());
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// Processes

namespace {

using Clock = std::chrono::steady_clock;

int cores_here() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// `name` on PATH (or `name` itself when it has a '/'); empty when not found.
std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string cand = (dir.empty() ? "." : dir) + "/" + name;
    if (access(cand.c_str(), X_OK) == 0 && !std::filesystem::is_directory(cand)) return cand;
  }
  return "";
}

// mpirun's own environment: what it and ssh need, never the user's whole environment (its local
// ranks inherit it; remote ranks get sshd's). Every rank variable travels as -x NAME=VALUE.
std::vector<std::string> mpirun_environment() {
  static const std::set<std::string> keep = {"PATH",    "LD_LIBRARY_PATH", "HOME",       "USER",
                                             "LOGNAME", "SHELL",           "TMPDIR",     "LANG",
                                             "LC_ALL",  "SSH_AUTH_SOCK",   "OPAL_PREFIX"};
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const std::string k = kv.substr(0, kv.find('='));
    if (keep.count(k) || k.rfind("OMPI_MCA_", 0) == 0 || k.rfind("PMIX_MCA_", 0) == 0 ||
        k.rfind("OMPI_ALLOW_RUN_AS_ROOT", 0) == 0)
      out.push_back(kv);
  }
  return out;
}

int g_signal_pipe = -1;
void on_launcher_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe, &b, 1);
  errno = saved;
}

// One run of the mpirun command: what ended it.
struct Attempt {
  int code = 0;                        // mpirun's exit code (128 + signal when killed)
  std::optional<RankFailure> failure;  // the first rank failure line seen in its output
  bool timed_out = false;              // the job's --timeout passed
  int stop_signal = 0;                 // SIGINT/SIGTERM/SIGHUP/SIGUSR1 that stopped it
  bool preempted = false;              // stop_signal was SIGTERM/SIGUSR1: the graceful stop
  std::vector<StoppedRank> stopped;    // the wrappers' "stopped on request" lines
  int late_signal = 0;                 // one that came after mpirun had exited: no restart
};

// The first stop signal (not SIGCHLD) waiting in the self-pipe, 0 when none; empties the pipe.
int pending_stop_signal(int fd) {
  int first = 0;
  unsigned char sigs[64];
  ssize_t n;
  while ((n = read(fd, sigs, sizeof sigs)) > 0)
    for (ssize_t i = 0; i < n; ++i)
      if (sigs[i] != SIGCHLD && !first) first = sigs[i];
  return first;
}

// Waits (up to 30 s) until nobody holds DIR/.lock, vit_train's DirLock: a killed job's rank 0
// may take a moment to go, and a restart's rank 0 would be refused the directory meanwhile.
void wait_for_dir_lock(const std::string& dir) {
  const int fd = open((dir + "/.lock").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  const auto until = Clock::now() + std::chrono::seconds(30);
  while (flock(fd, LOCK_EX | LOCK_NB) != 0 && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  close(fd);  // releases it
}

// DIR's entries named step-* (checkpoints, and saves that never completed: step-*.tmp).
std::vector<std::string> step_entries(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.rfind("step-", 0) == 0) out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Runs mpirun once with the launcher's signal handlers in place (they write to `sig_fd`'s pipe):
// forwards its stderr, stops it on a signal or at `deadline`, returns how it ended.
Attempt run_attempt(std::vector<std::string> argv, const RunOptions& opts,
                    std::optional<Clock::time_point> deadline, int sig_fd,
                    const std::vector<int>& handled) {
  int err_pipe[2];
  CAI_CHECK(pipe2(err_pipe, O_CLOEXEC) == 0, "[run] pipe: {}", std::strerror(errno));
  sigset_t block, old;
  sigemptyset(&block);
  for (int s : handled) sigaddset(&block, s);
  sigprocmask(SIG_BLOCK, &block, &old);
  std::vector<std::string> env = mpirun_environment();
  auto c_args = c_argv(argv);
  auto c_env = c_argv(env);
  const pid_t launcher = getpid();
  const pid_t pid = fork();
  CAI_CHECK(pid >= 0, "[run] fork: {}", std::strerror(errno));
  if (pid == 0) {
    // mpirun gets its own process group: a terminal's Ctrl-C reaches only us, and we forward it
    // once (a second SIGINT makes mpirun quit without cleaning up).
    setpgid(0, 0);
    // If we die without forwarding anything (SIGKILL), mpirun still stops the job.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != launcher) _exit(143);
    dup2(err_pipe[1], 2);
    for (int s : handled) signal(s, SIG_DFL);
    signal(SIGQUIT, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigprocmask(SIG_SETMASK, &old, nullptr);
    execve(argv[0].c_str(), c_args.data(), c_env.data());
    const std::string msg =
        fmt::format("colossalai run: cannot run {}: {}\n", argv[0], std::strerror(errno));
    write_all(2, msg.data(), msg.size());
    _exit(127);
  }
  setpgid(pid, pid);
  close(err_pipe[1]);
  sigprocmask(SIG_SETMASK, &old, nullptr);

  // The longest wait between checks of mpirun (its exit also wakes us at once, by SIGCHLD).
  const long long monitor_ms =
      std::max<long long>(1, static_cast<long long>(opts.monitor_interval * 1000));
  // kill_at: mpirun's group gets SIGKILL then; grace_until: the end of --grace_period after a
  // preempt signal, when mpirun gets SIGTERM (its own stop of every rank).
  std::optional<Clock::time_point> kill_at, drain_until, grace_until;
  bool exited = false, err_open = true;
  int status = 0;
  Attempt out;
  std::string line;

  auto scan = [&](const char* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (p[i] != '\n' && line.size() < 65536) {
        line += p[i];
        continue;
      }
      if (!out.failure) out.failure = parse_failure_line(line);
      if (auto r = parse_stopped_line(line)) out.stopped.push_back(*r);
      line.clear();
    }
  };
  auto stop = [&](int sig) {  // ask mpirun to stop every rank; SIGKILL its group if it hangs
    kill(pid, sig);
    kill_at = Clock::now() + std::chrono::seconds(10);
    grace_until.reset();
  };

  while (!exited || (err_open && (!drain_until || Clock::now() < *drain_until))) {
    const auto now = Clock::now();
    std::optional<Clock::time_point> next;
    for (const auto& t : {!out.timed_out && !out.stop_signal ? deadline : std::nullopt, kill_at,
                          exited ? drain_until : std::nullopt, exited ? std::nullopt : grace_until})
      if (t && (!next || *t < *next)) next = t;
    long long wait = exited ? -1 : monitor_ms;
    if (next) {
      const long long until_next =
          std::chrono::duration_cast<std::chrono::milliseconds>(*next - now).count() + 1;
      wait = std::max<long long>(0, wait < 0 ? until_next : std::min(wait, until_next));
    }
    const int wait_ms = static_cast<int>(std::min<long long>(wait, INT_MAX));
    pollfd fds[2] = {{err_open ? err_pipe[0] : -1, POLLIN, 0}, {sig_fd, POLLIN, 0}};
    const int r = poll(fds, 2, wait_ms);
    if (r < 0 && errno != EINTR) break;
    if (r > 0 && (fds[0].revents & (POLLIN | POLLHUP | POLLERR))) {
      char buf[8192];
      const ssize_t n = read(err_pipe[0], buf, sizeof buf);
      if (n > 0) {
        write_all(2, buf, static_cast<size_t>(n));
        scan(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        err_open = false;
      }
    }
    if (r > 0 && (fds[1].revents & POLLIN)) {
      unsigned char sigs[64];
      const ssize_t n = read(sig_fd, sigs, sizeof sigs);
      for (ssize_t i = 0; i < n; ++i) {
        const int s = sigs[i];
        if (s == SIGCHLD) continue;
        if (exited) {  // after mpirun: the job is over, but no restart may follow
          if (!out.late_signal) out.late_signal = s;
          continue;
        }
        if (!out.stop_signal && !out.timed_out && is_preempt_signal(s)) {
          // Preemption: every program gets the signal and --grace_period to save and exit.
          out.stop_signal = s;
          out.preempted = true;
          say(
              fmt::format("colossalai run: got {}: passing it to every rank and waiting up to {} s "
                          "(--grace_period) for them to stop",
                          signal_name(s), opts.grace_period));
          kill(pid, preempt_signal_to_mpirun(s));
          grace_until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(opts.grace_period));
        } else if (grace_until && is_preempt_signal(s)) {
          // SLURM sends SIGTERM after its SIGUSR1 warning: the ranks are already stopping.
          say(fmt::format("colossalai run: got {} while the ranks stop: still waiting",
                          signal_name(s)));
        } else if (!out.stop_signal && !out.timed_out) {
          out.stop_signal = s;
          say(fmt::format("colossalai run: got {}: stopping every rank", signal_name(s)));
          stop(s);
        } else if (grace_until) {  // Ctrl-C during the grace period: stop now
          say(fmt::format("colossalai run: got {}: stopping every rank now", signal_name(s)));
          stop(SIGTERM);
        } else {
          if (!out.stop_signal) out.stop_signal = s;
          say(fmt::format("colossalai run: got {} again: killing mpirun", signal_name(s)));
          kill(-pid, SIGKILL);
        }
      }
    }
    if (!exited && waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      drain_until = Clock::now() + std::chrono::seconds(2);
    }
    const auto t = Clock::now();
    if (!exited && deadline && !out.timed_out && !out.stop_signal && t >= *deadline) {
      out.timed_out = true;
      say(
          fmt::format("colossalai run: timeout: the job ran {} s (--timeout {}): stopping every "
                      "rank",
                      opts.timeout, opts.timeout));
      stop(SIGTERM);
    }
    if (!exited && grace_until && t >= *grace_until) {
      say(fmt::format(
          "colossalai run: the ranks did not all stop within {} s (--grace_period): stopping "
          "them",
          opts.grace_period));
      stop(SIGTERM);
    }
    if (!exited && kill_at && t >= *kill_at) {
      say("colossalai run: mpirun did not stop within 10 s: killing it");
      kill(-pid, SIGKILL);
      kill_at.reset();
    }
  }
  if (!exited) {  // poll failed: do not leave mpirun behind
    kill(-pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  if (!line.empty() && !out.failure) out.failure = parse_failure_line(line);
  // Whatever is left in mpirun's process group (its local ranks) goes now.
  kill(-pid, SIGKILL);
  close(err_pipe[0]);
  out.code = exit_code_of(status);
  return out;
}

}  // namespace

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  CAI_CHECK(!ec, "[run] cannot find this program's path (/proc/self/exe): {}", ec.message());
  return p.string();
}

int run_launch(const RunOptions& opts) {
  if (opts.rank_wrapper) return run_rank_wrapper(opts);
  LaunchPlan plan = make_plan(
      opts, [](const char* n) { return std::getenv(n); }, cores_here());
  plan.as_root = geteuid() == 0;
  plan.wrapper = self_exe();
  // Open MPI hands each rank a pty for stdout whatever ours is, so a rank's isatty() says nothing
  // about where its output ends up: tell the ranks whether our stdout is a terminal (unless the
  // caller already decided, e.g. -x CAI_STDOUT_TTY=0 or a nested launch).
  if (std::none_of(plan.env.begin(), plan.env.end(),
                   [](const auto& kv) { return kv.first == "CAI_STDOUT_TTY"; })) {
    const char* given = std::getenv("CAI_STDOUT_TTY");
    plan.env.emplace_back("CAI_STDOUT_TTY",
                          given && *given ? given : (isatty(STDOUT_FILENO) ? "1" : "0"));
  }
  const std::string mpirun = find_program("mpirun");
  plan.mpirun = mpirun.empty() ? "mpirun" : mpirun;
  std::vector<std::string> argv = build_mpirun_argv(plan);
  if (opts.dry_run) {
    std::cout << shell_join(argv) << std::endl;
    return 0;
  }
  CAI_CHECK(!mpirun.empty(),
            "[run] mpirun not found on PATH: colossalai run launches through Open MPI's mpirun "
            "(Debian: apt-get install openmpi-bin)");
  if (plan.hosts.empty())
    CAI_CHECK(!find_program(plan.command.front()).empty(),
              "[run] program {} not found or not executable{}", plan.command.front(),
              plan.command.front().find('/') == std::string::npos ? " (searched PATH)" : "");

  // Self-pipe for signals (one for the whole job, every attempt); mpirun's stderr through a pipe
  // per attempt (scanned for failure lines, forwarded byte for byte); its stdout is ours.
  std::string ck_dir;
  if (opts.max_restarts > 0) {
    try {
      ck_dir = vit_train_checkpoint_dir(plan.command);
    } catch (const Error& e) {
      say(fmt::format(
          "colossalai run: --max_restarts: cannot read the vit_train command's checkpoint.dir "
          "({}): a restart reruns the same command",
          e.what()));
    }
  }
  // A checkpoint.dir without step entries at the start: any step-*.tmp found at a restart is an
  // interrupted save of this job, which would make vit_train refuse the directory to a new run.
  const bool ck_dir_fresh = !ck_dir.empty() && step_entries(ck_dir).empty();
  int sig_pipe[2];
  CAI_CHECK(pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) == 0, "[run] pipe: {}", std::strerror(errno));
  g_signal_pipe = sig_pipe[1];
  const std::vector<int> handled = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGCHLD};
  {
    sigset_t block, old;
    sigemptyset(&block);
    for (int s : handled) sigaddset(&block, s);
    sigprocmask(SIG_BLOCK, &block, &old);
    for (int s : handled) {
      struct sigaction sa {};
      sa.sa_handler = on_launcher_signal;
      sa.sa_flags = SA_RESTART | (s == SIGCHLD ? SA_NOCLDSTOP : 0);
      sigemptyset(&sa.sa_mask);
      sigaction(s, &sa, nullptr);
    }
    sigprocmask(SIG_SETMASK, &old, nullptr);
  }
  std::optional<Clock::time_point> deadline;
  if (opts.timeout > 0)
    deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(opts.timeout));

  std::vector<AttemptFailure> failures;
  int result = 0;
  for (int attempt = 1;; ++attempt) {
    const Attempt a = run_attempt(argv, opts, deadline, sig_pipe[0], handled);
    if (a.timed_out) {
      say(
          fmt::format("colossalai run: timeout: job stopped after {} s (--timeout {}); all ranks "
                      "stopped",
                      opts.timeout, opts.timeout));
      result = 124;
      break;
    }
    if (a.stop_signal && a.preempted) {
      const int ranks = plan.nproc_per_node * std::max<int>(1, plan.hosts.size());
      say(preempt_summary(a.stop_signal, a.stopped, ranks, opts.grace_period));
      // Every rank's program stopped by itself and exited 0 (vit_train: saved at one step
      // boundary): a clean stop, exit 0; else 128 + the signal.
      const bool clean = static_cast<int>(a.stopped.size()) == ranks &&
                         std::all_of(a.stopped.begin(), a.stopped.end(), [](const auto& r) {
                           return r.signal == 0 && r.exit_code == 0;
                         });
      result = clean ? 0 : 128 + a.stop_signal;
      break;
    }
    if (a.stop_signal) {
      say(fmt::format("colossalai run: interrupted by {}; all ranks stopped",
                      signal_name(a.stop_signal)));
      result = 128 + a.stop_signal;
      break;
    }
    if (a.code == 0 && !a.stopped.empty()) {
      // SIGUSR1 sent to mpirun (or its ranks' wrappers) directly, not through this launcher: the
      // programs were asked to stop. Finished if every one exited 0, else stopped on request.
      const int sig = a.stopped.front().asked == "SIGUSR1" ? SIGUSR1 : SIGTERM;
      const bool finished = std::all_of(a.stopped.begin(), a.stopped.end(), [](const auto& r) {
        return r.signal == 0 && r.exit_code == 0;
      });
      if (!finished) {
        say(preempt_summary(sig, a.stopped,
                            plan.nproc_per_node * std::max<int>(1, plan.hosts.size()),
                            opts.grace_period));
        result = 128 + sig;
        break;
      }
    }
    if (a.code == 0) {
      if (!failures.empty())
        say(fmt::format("colossalai run: the job succeeded after {} restart{} (--max_restarts {})",
                        failures.size(), failures.size() == 1 ? "" : "s", opts.max_restarts));
      result = 0;
      break;
    }
    failures.push_back({attempt, a.failure, a.code});
    result = a.code;
    if (opts.max_restarts == 0) {
      if (a.failure)
        say(failure_summary(*a.failure));
      else
        say(
            fmt::format("colossalai run: mpirun failed with exit code {} (see its messages "
                        "above); all ranks stopped",
                        a.code));
      break;
    }
    const std::string what = a.failure
                                 ? fmt::format("rank {} (host {}) failed: {}", a.failure->rank,
                                               a.failure->host, failure_cause(*a.failure))
                                 : fmt::format("mpirun failed with exit code {}", a.code);
    if (attempt > opts.max_restarts) {
      say(fmt::format("colossalai run: attempt {} failed: {}; all ranks stopped", attempt, what));
      say(
          fmt::format("colossalai run: giving up after {} restart{} (--max_restarts {}); {} "
                      "failures:",
                      opts.max_restarts, opts.max_restarts == 1 ? "" : "s", opts.max_restarts,
                      failures.size()));
      for (const auto& f : failures) say("  " + describe_attempt_failure(f));
      break;
    }
    // The same mpirun command line again; a vit_train job with a complete checkpoint in its
    // checkpoint.dir continues from it (a new run into its own step directories is refused).
    LaunchPlan next = plan;
    std::string how = "with the same command";
    if (!ck_dir.empty()) {
      wait_for_dir_lock(ck_dir);
      std::string latest;
      try {
        latest = checkpoint::resolve_checkpoint(ck_dir);
      } catch (const Error&) {
      }
      if (!latest.empty()) {
        next.command = with_resume(plan.command);
        how = fmt::format("with --resume (newest complete checkpoint: {})", latest);
      } else {
        how = fmt::format("with the same command ({} holds no complete checkpoint yet)", ck_dir);
        std::vector<std::string> removed;
        for (const auto& n : ck_dir_fresh ? step_entries(ck_dir) : std::vector<std::string>{}) {
          if (n.size() < 4 || n.compare(n.size() - 4, 4, ".tmp") != 0) continue;
          std::error_code ec;
          std::filesystem::remove_all(std::filesystem::path(ck_dir) / n, ec);
          if (!ec) removed.push_back(n);
        }
        if (!removed.empty())
          how += fmt::format(" after removing this job's incomplete save{} {}",
                             removed.size() == 1 ? "" : "s", join(removed, ", "));
      }
    }
    say(
        fmt::format("colossalai run: attempt {} failed: {}; all ranks stopped; restart {} of {} "
                    "(--max_restarts "
                    "{}) {}",
                    attempt, what, attempt, opts.max_restarts, opts.max_restarts, how));
    if (const int s = a.late_signal ? a.late_signal : pending_stop_signal(sig_pipe[0])) {
      say(fmt::format("colossalai run: interrupted by {}; not restarting", signal_name(s)));
      result = 128 + s;
      break;
    }
    argv = build_mpirun_argv(next);
  }
  for (int s : handled) signal(s, SIG_DFL);
  close(sig_pipe[0]);
  close(sig_pipe[1]);
  g_signal_pipe = -1;
  return result;
}

// ---------------------------------------------------------------------------------------------
// CLI

void setup_run(CLI::App& app, RunOptions& opts) {
  auto* sub = app.add_subcommand(
      "run",
      "Launch PROGRAM on every rank through Open MPI's mpirun (ssh for remote hosts), like "
      "Colossal-AI's `colossalai run` / torchrun");
  sub->prefix_command();  // the first positional is the program: everything after it is its own
  sub->add_option("--nproc_per_node", opts.nproc_per_node,
                  "Processes (ranks) per host; -np is this times the number of hosts")
      ->required()
      ->check(cli::positive());
  sub->add_option(
         "--host", opts.host,
         "Comma-separated hosts to run on, N ranks each, in this order (default: this machine "
         "only; not with --hostfile)")
      ->delimiter(',')
      ->allow_extra_args(false);
  sub->add_option("--hostfile", opts.hostfile,
                  "File with one host per line (`host slots=N` accepted, N ignored); blank "
                  "lines and # comments skipped");
  sub->add_option(
         "--include", opts.include,
         "With --hostfile: use only these comma-separated hosts, kept in hostfile order (not "
         "with --exclude)")
      ->delimiter(',')
      ->allow_extra_args(false);
  sub->add_option("--exclude", opts.exclude,
                  "With --hostfile: leave out these comma-separated hosts (not with --include)")
      ->delimiter(',')
      ->allow_extra_args(false);
  sub->add_option("--num_nodes", opts.num_nodes,
                  "Use only the first K selected hosts (default: all of them)");
  sub->add_option("--master_addr", opts.master_addr,
                  "MASTER_ADDR for the ranks (default: the first host when there are several, "
                  "else 127.0.0.1)");
  sub->add_option("--master_port", opts.master_port, "MASTER_PORT for the ranks")
      ->capture_default_str()
      ->check(CLI::Range(1, 65535));
  sub->add_option("--ssh-port,--ssh_port", opts.ssh_port,
                  "ssh port of the remote hosts (mpirun --mca plm_rsh_args \"-p PORT\")")
      ->check(CLI::Range(1, 65535));
  sub->add_option("--extra_launch_args", opts.extra_launch_args,
                  "More mpirun arguments, split like a shell does (e.g. \"--mca "
                  "btl_tcp_if_include eth0\")");
  sub->add_option("-x,--env", opts.env,
                  "Also pass variable NAME (from this environment) or NAME=VALUE to every rank; "
                  "repeatable. Only MASTER_ADDR, MASTER_PORT, CAI_NPROC_PER_NODE, "
                  "CAI_COLLECTIVE_TIMEOUT, OMP_NUM_THREADS, CAI_NUM_THREADS, DATA, PATH, "
                  "LD_LIBRARY_PATH and CAI_STDOUT_TTY (1 when this launcher's stdout is a "
                  "terminal, else 0: ranks' own stdout is mpirun's pty) are passed otherwise")
      ->allow_extra_args(false);
  sub->add_flag("--dry-run", opts.dry_run,
                "Print the mpirun command (shell-quoted, one line) and exit without running it");
  sub->add_option("--timeout", opts.timeout,
                  "Stop the whole job after SECONDS and exit 124 (default: no limit; with "
                  "--max_restarts, counted from the first start)")
      ->check(cli::positive());
  sub->add_option("--max_restarts", opts.max_restarts,
                  "When a rank fails, stop every rank and start the job again (the same mpirun "
                  "command), at most N times; then give up, exit non-zero and list every "
                  "failure. A vit_train job whose checkpoint.dir holds a complete checkpoint "
                  "restarts with --resume (from its newest, `latest`), else as first started")
      ->capture_default_str()
      ->check(cli::non_negative());
  sub->add_option("--grace_period", opts.grace_period,
                  "After SIGTERM or SIGUSR1 (preemption; SLURM's warning signal), the seconds "
                  "every rank's program gets to save and exit after receiving that signal "
                  "before the launcher stops the ranks by force (torchrun waits 30 s too)")
      ->capture_default_str()
      ->check(cli::non_negative());
  sub->add_option("--monitor_interval", opts.monitor_interval,
                  "Seconds between the launcher's checks of its ranks (a rank's exit is also "
                  "noticed at once)")
      ->capture_default_str()
      ->check(cli::positive());
  sub->footer(
      "Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK (and Open MPI's "
      "OMPI_COMM_WORLD_*). When a rank fails, every rank on every host is stopped and the exit "
      "names the rank, host and exit code or signal; with --max_restarts N the job then starts "
      "again, up to N times (a job that succeeds after restarts exits 0 and says how many it "
      "took). SIGTERM or SIGUSR1 (preemption) reach every rank's program as that signal, and the "
      "launcher waits --grace_period seconds for them to exit (vit_train saves a checkpoint at "
      "the next step boundary and exits 0) before stopping the rest; it then exits 0 when every "
      "program exited 0 within the grace period, else 143 (SIGTERM) or 138 (SIGUSR1). Ctrl-C stops "
      "the job at once (exit 130); none of these "
      "restart it.");
  // PROGRAM [ARGS...]: prefix_command() hands the first positional and everything after it to
  // remaining(), unparsed. After "--", CLI11 2.1 would give the rest back to the parent app unless
  // the subcommand has a positional, so `program` takes what follows "--" (its validator refuses
  // anything before it, which then falls to prefix_command()).
  sub->validate_positionals();
  sub->add_option("PROGRAM", opts.after_dashes,
                  "The program every rank runs, then its arguments, passed unchanged (its own "
                  "--flags too; a \"--\" before PROGRAM is optional)")
      ->check(CLI::Validator(
          [sub](std::string&) -> std::string {
            const auto rem = sub->remaining();
            return !rem.empty() && rem.front() == "--" ? "" : "not after --";
          },
          "", "after --"));
  sub->callback([sub, &opts] {
    opts.command = sub->remaining();
    if (!opts.command.empty() && opts.command.front() == "--")
      opts.command.erase(opts.command.begin());
    opts.command.insert(opts.command.end(), opts.after_dashes.begin(), opts.after_dashes.end());
  });

  auto* wrap = app.add_subcommand(kWrapperCommand, "internal: runs one rank for colossalai run");
  wrap->group("");  // hidden
  wrap->prefix_command();
  wrap->callback([wrap, &opts] {
    opts.rank_wrapper = true;
    opts.command = wrap->remaining();
  });
}

}  // namespace cai::app
