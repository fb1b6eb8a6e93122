// `colossalai run`: Colossal-AI's launcher, over Open MPI's mpirun (ssh for remote hosts).
//
//   colossalai run --nproc_per_node N [--host h1,h2 | --hostfile F [--include a,b | --exclude c]]
//                  [--num_nodes K] [--master_addr A] [--master_port P] [--ssh-port S]
//                  [--extra_launch_args "..."] [-x NAME[=VALUE] ...] [--dry-run]
//                  [--timeout SECONDS] [--max_restarts N] [--monitor_interval SECONDS]
//                  [--grace_period SECONDS] PROGRAM [ARGS...]
//
// Every rank runs under `colossalai _rank_wrapper PROGRAM ARGS` (hidden subcommand): the wrapper
// sets torchrun's RANK/WORLD_SIZE/LOCAL_RANK/..., runs the program in its own process group,
// kills that group when mpirun stops the rank, and reports a failing rank in one line that the
// launcher turns into its final summary. SIGTERM / SIGUSR1 to the launcher reach every program
// as that signal and the ranks get --grace_period seconds to save and exit (run_preempt.h).
//
// The pure parts (hostfile, host selection, environment, mpirun argv, failure lines) throw
// cai::Error with messages starting with "[run]"; only main turns them into exit codes.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace cai::app {

struct RunOptions {
  int nproc_per_node = 0;
  std::vector<std::string> host;  // --host h1,h2
  std::string hostfile;
  std::vector<std::string> include, exclude;
  int num_nodes = -1;  // -1: every selected host
  std::string master_addr;
  int master_port = 29500;
  int ssh_port = 0;  // 0: ssh's default
  std::string extra_launch_args;
  std::vector<std::string> env;  // -x NAME or NAME=VALUE
  bool dry_run = false;
  double timeout = 0;                // seconds; 0: none
  int max_restarts = 0;              // restarts of the whole job after a failure (torchrun's)
  double monitor_interval = 5;       // seconds: the longest the launcher waits between checks
  double grace_period = 60;          // seconds the ranks get to stop after SIGTERM/SIGUSR1
  std::vector<std::string> command;  // PROGRAM ARGS... (everything after the program, unparsed)
  bool rank_wrapper = false;         // set by the hidden `_rank_wrapper` subcommand
  std::vector<std::string> after_dashes;  // parsing detail: PROGRAM ARGS given after "--"
};

// One host of a hostfile; `line` is 1-based, `slots` is -1 when the line has no slots=N.
struct HostEntry {
  std::string name;
  int line = 0;
  int slots = -1;
};

// Hostfile text: one host per line, optional `slots=N` (ignored: --nproc_per_node governs),
// blank lines and `#` comments (also trailing ones) skipped. Duplicates are errors naming both
// lines; a file without hosts is an error. `path` only names the file in messages.
std::vector<HostEntry> parse_hostfile(const std::string& text, const std::string& path);
std::vector<HostEntry> read_hostfile(const std::string& path);  // error if missing

// The hosts the job runs on, in order: --host, or the hostfile filtered by --include/--exclude,
// then the first --num_nodes. Empty means this machine only. Also checks the flag combinations.
std::vector<std::string> select_hosts(const RunOptions& o);

// --master_addr, else the first host when there are several, else 127.0.0.1.
std::string master_addr_for(const RunOptions& o, const std::vector<std::string>& hosts);

using Getenv = std::function<const char*(const char*)>;

// The variables every rank gets (mpirun -x NAME=VALUE), in order, never the whole environment:
// MASTER_ADDR, MASTER_PORT, CAI_NPROC_PER_NODE; CAI_COLLECTIVE_TIMEOUT, OMP_NUM_THREADS,
// CAI_NUM_THREADS, DATA, PATH, LD_LIBRARY_PATH when set (CAI_NUM_THREADS = max(1, cores /
// nproc_per_node) when neither thread variable is set); then each -x (a user value replaces a
// default one of the same name). -x NAME of an unset variable is an error.
std::vector<std::pair<std::string, std::string>> forwarded_env(const RunOptions& o,
                                                               const std::string& master_addr,
                                                               const Getenv& getenv,
                                                               int cores_per_host);

// Shell-like split of --extra_launch_args: whitespace, '…', "…" and backslash escapes.
std::vector<std::string> split_shell_words(const std::string& s);
// One argument quoted for a POSIX shell (unchanged when it needs no quoting).
std::string shell_quote(const std::string& s);
std::string shell_join(const std::vector<std::string>& argv);

struct LaunchPlan {
  std::string mpirun = "mpirun";  // path or name of mpirun
  std::string wrapper;            // this binary (colossalai), run as `wrapper _rank_wrapper ...`
  bool as_root = false;           // adds --allow-run-as-root
  int nproc_per_node = 1;
  std::vector<std::string> hosts;  // empty: localhost
  int ssh_port = 0;
  std::vector<std::string> extra_args;
  std::vector<std::pair<std::string, std::string>> env;
  std::vector<std::string> command;
};

// The plan for these options (hosts, master address, environment, extra args); the caller fills
// mpirun, wrapper and as_root.
LaunchPlan make_plan(const RunOptions& o, const Getenv& getenv, int cores_per_host);

// mpirun [--allow-run-as-root] --oversubscribe -np N --host h1:n,h2:n [--bind-to none]
//        [--mca plm_rsh_args "-p S"] --mca ess_base_forward_signals N EXTRA... -x NAME=VALUE...
//        WRAPPER _rank_wrapper PROGRAM ARGS
// (N = preempt_term_signal(), SIGTERM's stand-in; left out when EXTRA sets that parameter.)
std::vector<std::string> build_mpirun_argv(const LaunchPlan& p);

// A rank failure as reported in mpirun's output: our wrapper's line
// "[colossalai run] rank R on host H exited with code C" / "was killed by signal S (SIGNAME)",
// or Open MPI's own "mpirun noticed that process rank R with PID P on node H exited on signal S".
struct RankFailure {
  std::string rank, host;
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string signal_name;
};
std::optional<RankFailure> parse_failure_line(const std::string& line);
std::string wrapper_failure_line(const std::string& rank, const std::string& host, int status);
std::string failure_summary(const RankFailure& f);  // "rank 3 (host h) failed: exit code 3; ..."
std::string signal_name(int sig);                   // "SIGKILL"; "signal 42" if unknown

// One failure of the job, for --max_restarts' list: the rank's line when one was seen, else
// mpirun's exit code.
struct AttemptFailure {
  int attempt = 1;  // 1-based
  std::optional<RankFailure> rank;
  int mpirun_code = 0;
};
// "exit code 3" / "killed by signal 9 (SIGKILL)".
std::string failure_cause(const RankFailure& f);
// "attempt 2: rank 1 (host h): killed by signal 9 (SIGKILL)" or "attempt 2: mpirun exited with
// code 1 (no rank named a failure)".
std::string describe_attempt_failure(const AttemptFailure& f);

// When `command` runs vit_train (its program's file name): the checkpoint.dir of its --config
// with its --set overrides (the config loaded as vit_train loads it), else "". Errors of the
// config are cai::Error.
std::string vit_train_checkpoint_dir(const std::vector<std::string>& command);
// `command` for a restart that continues from checkpoint.dir: any --resume [VALUE] /
// --resume=VALUE removed, then `--resume` (no value: vit_train's checkpoint.dir) appended.
std::vector<std::string> with_resume(const std::vector<std::string>& command);

// This program's path (/proc/self/exe).
std::string self_exe();

void setup_run(CLI::App& app, RunOptions& opts);
int run_launch(const RunOptions& opts);
int run_rank_wrapper(const RunOptions& opts);

}  // namespace cai::app
