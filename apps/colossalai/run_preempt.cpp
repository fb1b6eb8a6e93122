#include "run_preempt.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <map>
#include <regex>

#include "cmd_run.h"

namespace cai::app {

bool is_preempt_signal(int sig) {
  return sig == SIGTERM || sig == SIGUSR1;
}

int preempt_term_signal() {
  return SIGRTMIN + 5;
}

int preempt_signal_to_mpirun(int sig) {
  return sig == SIGTERM ? preempt_term_signal() : sig;
}

int preempt_signal_to_program(int received) {
  if (received == preempt_term_signal()) return SIGTERM;
  if (received == SIGUSR1) return SIGUSR1;
  return 0;
}

std::string wrapper_stopped_line(const std::string& rank, const std::string& host, int asked,
                                 int status) {
  const std::string how =
      WIFSIGNALED(status)
          ? fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                        signal_name(WTERMSIG(status)))
          : fmt::format("exited with code {}", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return fmt::format("[colossalai run] rank {} on host {} stopped on request ({}): {}", rank, host,
                     signal_name(asked), how);
}

std::optional<StoppedRank> parse_stopped_line(const std::string& line) {
  static const std::regex re(
      R"re(\[colossalai run\] rank (\S+) on host (\S+) stopped on request \((\w+)\): (?:exited with code (-?\d+)|was killed by signal (\d+) ))re");
  std::smatch m;
  if (!std::regex_search(line, m, re)) return std::nullopt;
  StoppedRank r;
  r.rank = m[1], r.host = m[2], r.asked = m[3];
  if (m[4].matched)
    r.exit_code = std::stoi(m[4]);
  else
    r.signal = std::stoi(m[5]);
  return r;
}

std::string preempt_summary(int sig, const std::vector<StoppedRank>& stopped, int ranks,
                            double grace_period) {
  // Ranks by outcome: "exited with code 143: ranks 0, 1".
  std::vector<StoppedRank> sorted = stopped;  // in rank order, whatever order the lines came in
  std::stable_sort(sorted.begin(), sorted.end(), [](const StoppedRank& a, const StoppedRank& b) {
    return a.rank.size() != b.rank.size() ? a.rank.size() < b.rank.size() : a.rank < b.rank;
  });
  std::map<std::string, std::vector<std::string>> by_how;
  for (const auto& r : sorted)
    by_how[r.signal ? fmt::format("killed by signal {} ({})", r.signal, signal_name(r.signal))
                    : fmt::format("exited with code {}", r.exit_code)]
        .push_back(r.rank);
  std::string hows;
  for (const auto& [how, rs] : by_how) {
    std::string list;
    for (size_t i = 0; i < rs.size(); ++i) list += (i ? ", " : "") + rs[i];
    hows += fmt::format("{}{} {}: {}", hows.empty() ? "" : "; ", rs.size() == 1 ? "rank" : "ranks",
                        list, how);
  }
  const int n = static_cast<int>(stopped.size());
  std::string out = fmt::format("colossalai run: stopped on request ({}): ", signal_name(sig));
  if (n >= ranks)
    out +=
        fmt::format("every rank ({} of {}) stopped within the grace period ({})", n, ranks, hows);
  else
    out += fmt::format(
        "{} of {} ranks stopped within the grace period{}; the others were stopped by force "
        "after --grace_period {} s",
        n, ranks, n ? " (" + hows + ")" : "", grace_period);
  return out;
}

}  // namespace cai::app
