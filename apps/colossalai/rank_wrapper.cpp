// The rank wrapper: colossalai _rank_wrapper PROGRAM ARGS, one per rank, started by mpirun
// (cmd_run.h). Moved out of cmd_run.cpp with the preemption hand-off (run_preempt.h).
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "cai/core/error.h"
#include "cmd_run.h"
#include "run_internal.h"
#include "run_preempt.h"

namespace cai::app {

using namespace detail;

namespace {
constexpr const char* kMarker = "[colossalai run] ";
using Clock = std::chrono::steady_clock;
}  // namespace

int run_rank_wrapper(const RunOptions& opts) {
  std::vector<std::string> cmd = opts.command;
  if (!cmd.empty() && cmd.front() == "--") cmd.erase(cmd.begin());
  CAI_CHECK(!cmd.empty(), "[run] {}: no program given", kWrapperCommand);

  auto env = [](const char* n) -> std::string {
    const char* v = std::getenv(n);
    return v ? v : "";
  };
  std::string rank = env("OMPI_COMM_WORLD_RANK");
  if (rank.empty()) rank = env("PMIX_RANK");
  if (rank.empty()) rank = "?";
  char hostbuf[256] = {};
  gethostname(hostbuf, sizeof hostbuf - 1);
  const std::string host = hostbuf[0] ? hostbuf : "?";

  // torchrun's variables, for programs that read them.
  if (!env("OMPI_COMM_WORLD_RANK").empty()) {
    setenv("RANK", env("OMPI_COMM_WORLD_RANK").c_str(), 1);
    setenv("WORLD_SIZE", env("OMPI_COMM_WORLD_SIZE").c_str(), 1);
    setenv("LOCAL_RANK", env("OMPI_COMM_WORLD_LOCAL_RANK").c_str(), 1);
    setenv("LOCAL_WORLD_SIZE", env("OMPI_COMM_WORLD_LOCAL_SIZE").c_str(), 1);
    long r = 0, n = 0;
    if (parse_int(rank, &r) && parse_int(env("CAI_NPROC_PER_NODE"), &n) && n > 0) {
      setenv("NODE_RANK", std::to_string(r / n).c_str(), 1);
      setenv("GROUP_RANK", std::to_string(r / n).c_str(), 1);
    }
  }

  const int stops[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
  sigset_t set, old;
  sigemptyset(&set);
  for (int s : stops) sigaddset(&set, s);
  const int preempt_term = preempt_term_signal();
  for (int s : {SIGCHLD, SIGUSR1, SIGUSR2, preempt_term}) sigaddset(&set, s);
  sigprocmask(SIG_BLOCK, &set, &old);
  // An ignored signal is dropped even while blocked: mpirun may hand us ignored ones.
  for (int s : stops) signal(s, SIG_DFL);
  for (int s : {SIGCHLD, SIGUSR1, SIGUSR2, preempt_term}) signal(s, SIG_DFL);

  const pid_t parent = getpid();
  auto c_args = c_argv(cmd);
  const pid_t pid = fork();
  CAI_CHECK(pid >= 0, "[run] fork: {}", std::strerror(errno));
  if (pid == 0) {
    // Own process group (so the whole program can be stopped), and die with the wrapper.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(137);
    sigprocmask(SIG_SETMASK, &old, nullptr);
    execvp(c_args[0], c_args.data());
    const std::string msg = fmt::format("{}rank {} on host {}: cannot run {}: {}\n", kMarker, rank,
                                        host, cmd.front(), std::strerror(errno));
    write_all(2, msg.data(), msg.size());
    _exit(127);
  }
  setpgid(pid, pid);

  int status = 0, stop_signal = 0;
  int asked = 0;  // the preempt signal passed on to the program (SIGTERM / SIGUSR1), 0 if none
  std::optional<Clock::time_point> kill_at;
  for (;;) {
    siginfo_t info;
    int s;
    if (kill_at) {
      const auto left = std::max<long long>(
          0, std::chrono::duration_cast<std::chrono::nanoseconds>(*kill_at - Clock::now()).count());
      timespec ts{static_cast<time_t>(left / 1000000000), static_cast<long>(left % 1000000000)};
      s = sigtimedwait(&set, &info, &ts);
    } else {
      s = sigwaitinfo(&set, &info);
    }
    if (s < 0) {
      if (errno == EAGAIN) {  // the grace period is over
        kill(-pid, SIGKILL);
        kill_at.reset();
      }
      if (waitpid(pid, &status, WNOHANG) == pid) break;
      continue;
    }
    if (s == SIGCHLD) {
      if (waitpid(pid, &status, WNOHANG) == pid) break;
    } else if (const int to_program = preempt_signal_to_program(s)) {
      // The launcher's preemption (run_preempt.h): the program saves and exits in its own time;
      // the launcher ends the grace period (mpirun's SIGTERM, below) if it does not.
      kill(-pid, to_program);
      if (!asked) asked = to_program;
    } else if (s == SIGUSR2) {
      kill(-pid, s);
    } else if (!stop_signal) {
      // mpirun stops this rank (another failed, a timeout, Ctrl-C): pass it on, then SIGKILL the
      // group before mpirun's own SIGKILL (1 s) would leave the program's children behind.
      stop_signal = s;
      kill(-pid, s);
      kill_at = Clock::now() + std::chrono::milliseconds(500);
    }
  }
  if (stop_signal) {
    // Stopped from outside: not this rank's failure, so nothing to report.
    kill(-pid, SIGKILL);
    signal(stop_signal, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, stop_signal);
    sigprocmask(SIG_UNBLOCK, &one, nullptr);
    raise(stop_signal);
    return 128 + stop_signal;
  }
  if (asked) {
    // Stopped on request however it ended: told to the launcher, and exit 0 so that mpirun does
    // not kill the ranks that are still saving.
    kill(-pid, SIGKILL);
    say(wrapper_stopped_line(rank, host, asked, status));
    return 0;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return 0;
  kill(-pid, SIGKILL);  // the failed program's leftovers
  say(wrapper_failure_line(rank, host, status));
  return exit_code_of(status);
}

}  // namespace cai::app
