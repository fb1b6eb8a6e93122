// Preemption under `colossalai run` (torchrun's and SLURM's conventions): SIGTERM or SIGUSR1 to
// the launcher reaches every rank's program as that signal, and the launcher then waits
// --grace_period seconds for the ranks to save and exit before it stops them for good.
//
// The path of a signal: launcher -> mpirun -> each rank's _rank_wrapper -> the program's process
// group. mpirun kills the job on SIGTERM (its ranks get SIGTERM then SIGKILL a second later), so
// the launcher never sends mpirun SIGTERM to preempt: SIGUSR1 travels as itself (mpirun forwards
// it by default) and SIGTERM as a real-time signal, SIGRTMIN+5, that the launcher adds to mpirun's
// forwarded signals (--mca ess_base_forward_signals); the wrapper turns it back into SIGTERM.
// A wrapper that passed such a request on reports how its program ended in one line and exits 0
// (so mpirun does not kill the ranks still saving); the launcher collects those lines.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace cai::app {

// SIGTERM and SIGUSR1: the signals the launcher treats as "save and stop".
bool is_preempt_signal(int sig);
// SIGRTMIN + 5: SIGTERM's stand-in between the launcher and the wrappers.
int preempt_term_signal();
// The signal the launcher sends mpirun for a preempt signal it received.
int preempt_signal_to_mpirun(int sig);
// The signal a wrapper sends its program for one it received from mpirun: SIGTERM for
// preempt_term_signal(), SIGUSR1 for SIGUSR1; 0 for any other.
int preempt_signal_to_program(int received);

// "[colossalai run] rank R on host H stopped on request (SIGTERM): exited with code 143" or
// "...: was killed by signal 15 (SIGTERM)"; `status` is waitpid's.
std::string wrapper_stopped_line(const std::string& rank, const std::string& host, int asked,
                                 int status);
struct StoppedRank {
  std::string rank, host, asked;  // asked: "SIGTERM"
  int exit_code = -1;             // -1 when killed by a signal
  int signal = 0;
};
std::optional<StoppedRank> parse_stopped_line(const std::string& line);

// The launcher's last line after a preemption by `sig`: which ranks stopped within the grace
// period and how (grouped by outcome), and how many did not (stopped by force after it).
std::string preempt_summary(int sig, const std::vector<StoppedRank>& stopped, int ranks,
                            double grace_period);

}  // namespace cai::app
