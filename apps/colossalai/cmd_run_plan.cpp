// The pure parts of `colossalai run` (cmd_run.h): hostfile and host selection, the forwarded
// environment and shell quoting, the mpirun command, failure lines and vit_train restarts. The
// processes (running mpirun, signals, restarts) and the CLI stay in cmd_run.cpp.
#include "cmd_run.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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

#include "cai/checkpoint/checkpoint.h"
#include "cai/config/config.h"
#include "cai/core/error.h"
#include "run_internal.h"
#include "run_preempt.h"

namespace cai::app {

using namespace detail;

namespace {

constexpr const char* kMarker = "[colossalai run] ";

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// Host names as mpirun's --host takes them: letters, digits, '.', '-', '_' (IPv4 addresses
// included); ',' and ':' would break `--host h:N`.
bool valid_host(const std::string& h) {
  if (h.empty() || h.front() == '-' || h.front() == '.') return false;
  return std::all_of(h.begin(), h.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_';
  });
}

bool valid_env_name(const std::string& n) {
  if (n.empty() || std::isdigit(static_cast<unsigned char>(n.front()))) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

// Hosts named by --include/--exclude/--host, each checked.
std::vector<std::string> host_list(const std::vector<std::string>& items, const char* flag) {
  std::vector<std::string> out;
  for (const auto& raw : items) {
    const std::string h = trim(raw);
    CAI_CHECK(valid_host(h), "[run] {}: '{}' is not a host name", flag, raw);
    out.push_back(h);
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Hostfile and host selection

std::vector<HostEntry> parse_hostfile(const std::string& text, const std::string& path) {
  std::vector<HostEntry> out;
  std::map<std::string, int> seen;
  std::istringstream in(text);
  std::string raw;
  int ln = 0;
  while (std::getline(in, raw)) {
    ++ln;
    if (const auto hash = raw.find('#'); hash != std::string::npos) raw.resize(hash);
    std::istringstream words(raw);
    std::string name, word;
    if (!(words >> name)) continue;  // blank or comment-only line
    CAI_CHECK(valid_host(name), "[run] hostfile {} line {}: '{}' is not a host name", path, ln,
              name);
    HostEntry e{name, ln, -1};
    while (words >> word) {
      long slots = 0;
      CAI_CHECK(word.rfind("slots=", 0) == 0 && parse_int(word.substr(6), &slots) && slots >= 1 &&
                    slots <= std::numeric_limits<int>::max(),
                "[run] hostfile {} line {}: unexpected '{}' after host {} (only slots=N may "
                "follow a host)",
                path, ln, word, name);
      e.slots = static_cast<int>(slots);
    }
    if (auto it = seen.find(name); it != seen.end())
      fail("[run] hostfile {}: host {} is listed twice, on lines {} and {}", path, name, it->second,
           ln);
    seen[name] = ln;
    out.push_back(e);
  }
  CAI_CHECK(!out.empty(), "[run] hostfile {} lists no hosts (only blank lines or comments)", path);
  return out;
}

std::vector<HostEntry> read_hostfile(const std::string& path) {
  std::error_code ec;
  CAI_CHECK(std::filesystem::exists(path, ec), "[run] hostfile {} not found", path);
  CAI_CHECK(!std::filesystem::is_directory(path, ec), "[run] hostfile {} is a directory", path);
  std::ifstream f(path);
  CAI_CHECK(f.good(), "[run] cannot read hostfile {}: {}", path, std::strerror(errno));
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_hostfile(ss.str(), path);
}

std::vector<std::string> select_hosts(const RunOptions& o) {
  const bool have_file = !o.hostfile.empty();
  CAI_CHECK(o.host.empty() || !have_file, "[run] --host and --hostfile {} are mutually exclusive",
            o.hostfile);
  CAI_CHECK(o.include.empty() || o.exclude.empty(),
            "[run] --include {} and --exclude {} are mutually exclusive", join(o.include, ","),
            join(o.exclude, ","));
  CAI_CHECK(o.include.empty() || have_file, "[run] --include {} works only with --hostfile",
            join(o.include, ","));
  CAI_CHECK(o.exclude.empty() || have_file, "[run] --exclude {} works only with --hostfile",
            join(o.exclude, ","));

  std::vector<std::string> hosts;
  if (!o.host.empty()) {
    hosts = host_list(o.host, "--host");
    std::set<std::string> seen;
    for (const auto& h : hosts) CAI_CHECK(seen.insert(h).second, "[run] --host lists {} twice", h);
  } else if (have_file) {
    const auto entries = read_hostfile(o.hostfile);
    std::set<std::string> in_file;
    for (const auto& e : entries) in_file.insert(e.name);
    const auto include = host_list(o.include, "--include");
    const auto exclude = host_list(o.exclude, "--exclude");
    for (const auto& h : include)
      CAI_CHECK(in_file.count(h), "[run] --include: host {} is not in hostfile {}", h, o.hostfile);
    for (const auto& h : exclude)
      CAI_CHECK(in_file.count(h), "[run] --exclude: host {} is not in hostfile {}", h, o.hostfile);
    const std::set<std::string> inc(include.begin(), include.end()),
        exc(exclude.begin(), exclude.end());
    // A filter: the hostfile's order (node ranks, the master) is kept.
    for (const auto& e : entries)
      if ((inc.empty() || inc.count(e.name)) && !exc.count(e.name)) hosts.push_back(e.name);
    CAI_CHECK(!hosts.empty(), "[run] --exclude {} leaves no host of hostfile {}",
              join(exclude, ","), o.hostfile);
  }

  if (o.num_nodes != -1) {
    CAI_CHECK(o.num_nodes >= 1, "[run] --num_nodes {} must be at least 1", o.num_nodes);
    if (hosts.empty()) {
      CAI_CHECK(o.num_nodes == 1,
                "[run] --num_nodes {} without --host or --hostfile: only this machine is known",
                o.num_nodes);
    } else {
      CAI_CHECK(static_cast<size_t>(o.num_nodes) <= hosts.size(),
                "[run] --num_nodes {} but only {} host(s) selected ({})", o.num_nodes, hosts.size(),
                join(hosts, ","));
      hosts.resize(o.num_nodes);
    }
  }
  return hosts;
}

std::string master_addr_for(const RunOptions& o, const std::vector<std::string>& hosts) {
  if (!o.master_addr.empty()) return o.master_addr;
  return hosts.size() > 1 ? hosts.front() : "127.0.0.1";
}

// ---------------------------------------------------------------------------------------------
// Environment, quoting, the mpirun command

std::vector<std::pair<std::string, std::string>> forwarded_env(const RunOptions& o,
                                                               const std::string& master_addr,
                                                               const Getenv& getenv,
                                                               int cores_per_host) {
  std::vector<std::pair<std::string, std::string>> env;
  auto set = [&env](const std::string& k, const std::string& v) {
    for (auto& kv : env)
      if (kv.first == k) {
        kv.second = v;
        return;
      }
    env.emplace_back(k, v);
  };
  auto pass = [&](const char* name) {
    if (const char* v = getenv(name)) set(name, v);
  };
  set("MASTER_ADDR", master_addr);
  set("MASTER_PORT", std::to_string(o.master_port));
  set("CAI_NPROC_PER_NODE", std::to_string(o.nproc_per_node));
  pass("CAI_COLLECTIVE_TIMEOUT");
  const char* omp = getenv("OMP_NUM_THREADS");
  const char* cai = getenv("CAI_NUM_THREADS");
  if (omp || cai) {
    pass("OMP_NUM_THREADS");
    pass("CAI_NUM_THREADS");
  } else {
    set("CAI_NUM_THREADS",
        std::to_string(std::max(1, cores_per_host / std::max(1, o.nproc_per_node))));
  }
  pass("DATA");
  pass("PATH");
  pass("LD_LIBRARY_PATH");
  for (const auto& x : o.env) {
    const auto eq = x.find('=');
    const std::string name = x.substr(0, eq);
    CAI_CHECK(valid_env_name(name), "[run] -x {}: '{}' is not a variable name", x, name);
    if (eq != std::string::npos) {
      set(name, x.substr(eq + 1));
    } else {
      const char* v = getenv(name.c_str());
      CAI_CHECK(v != nullptr, "[run] -x {}: {} is not set in this environment (use -x {}=VALUE)",
                name, name, name);
      set(name, v);
    }
  }
  return env;
}

std::vector<std::string> split_shell_words(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  bool have = false;  // an empty '' still makes a word
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\'') {
      const auto end = s.find('\'', i + 1);
      CAI_CHECK(end != std::string::npos, "[run] --extra_launch_args {}: unterminated ' quote", s);
      cur += s.substr(i + 1, end - i - 1);
      i = end;
      have = true;
    } else if (c == '"') {
      size_t j = i + 1;
      for (; j < s.size() && s[j] != '"'; ++j) {
        if (s[j] == '\\' && j + 1 < s.size() && std::strchr("\"\\$`", s[j + 1])) ++j;
        cur += s[j];
      }
      CAI_CHECK(j < s.size(), "[run] --extra_launch_args {}: unterminated \" quote", s);
      i = j;
      have = true;
    } else if (c == '\\') {
      CAI_CHECK(i + 1 < s.size(), "[run] --extra_launch_args {}: trailing backslash", s);
      cur += s[++i];
      have = true;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      if (have) out.push_back(cur);
      cur.clear();
      have = false;
    } else {
      cur += c;
      have = true;
    }
  }
  if (have) out.push_back(cur);
  return out;
}

std::string shell_quote(const std::string& s) {
  if (!s.empty() && std::all_of(s.begin(), s.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("@%+=:,./_-", c);
      }))
    return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string shell_join(const std::vector<std::string>& argv) {
  std::string out;
  for (size_t i = 0; i < argv.size(); ++i) out += (i ? " " : "") + shell_quote(argv[i]);
  return out;
}

LaunchPlan make_plan(const RunOptions& o, const Getenv& getenv, int cores_per_host) {
  CAI_CHECK(o.nproc_per_node >= 1, "[run] --nproc_per_node {} must be at least 1",
            o.nproc_per_node);
  CAI_CHECK(o.master_port >= 1 && o.master_port <= 65535,
            "[run] --master_port {} is not a port (1-65535)", o.master_port);
  CAI_CHECK(o.ssh_port >= 0 && o.ssh_port <= 65535, "[run] --ssh-port {} is not a port (1-65535)",
            o.ssh_port);
  CAI_CHECK(o.timeout >= 0, "[run] --timeout {} must be positive", o.timeout);
  CAI_CHECK(o.max_restarts >= 0, "[run] --max_restarts {} must be 0 or more", o.max_restarts);
  CAI_CHECK(o.monitor_interval > 0, "[run] --monitor_interval {} must be positive",
            o.monitor_interval);
  std::vector<std::string> command = o.command;
  if (!command.empty() && command.front() == "--") command.erase(command.begin());
  CAI_CHECK(!command.empty(), "[run] no program given: colossalai run [OPTIONS] PROGRAM [ARGS...]");
  CAI_CHECK(command.front().empty() || command.front().front() != '-',
            "[run] unknown option {} (options go before the program; see colossalai run --help)",
            command.front());
  LaunchPlan p;
  p.nproc_per_node = o.nproc_per_node;
  p.hosts = select_hosts(o);
  p.ssh_port = o.ssh_port;
  p.extra_args = split_shell_words(o.extra_launch_args);
  p.env = forwarded_env(o, master_addr_for(o, p.hosts), getenv, cores_per_host);
  p.command = std::move(command);
  return p;
}

std::vector<std::string> build_mpirun_argv(const LaunchPlan& p) {
  std::vector<std::string> a{p.mpirun};
  if (p.as_root) a.push_back("--allow-run-as-root");
  a.push_back("--oversubscribe");
  const size_t nodes = std::max<size_t>(1, p.hosts.size());
  a.insert(a.end(), {"-np", std::to_string(p.nproc_per_node * nodes), "--host"});
  std::vector<std::string> slots;
  for (const auto& h : p.hosts) slots.push_back(fmt::format("{}:{}", h, p.nproc_per_node));
  if (slots.empty()) slots.push_back(fmt::format("localhost:{}", p.nproc_per_node));
  a.push_back(join(slots, ","));
  // mpirun binds each rank to one core by default (np <= 2), which serialises a rank's thread
  // pool; torchrun does not bind. --extra_launch_args "--bind-to core" overrides.
  if (std::find(p.extra_args.begin(), p.extra_args.end(), "--bind-to") == p.extra_args.end())
    a.insert(a.end(), {"--bind-to", "none"});
  if (p.ssh_port > 0)
    a.insert(a.end(), {"--mca", "plm_rsh_args", fmt::format("-p {}", p.ssh_port)});
  // SIGTERM's stand-in (run_preempt.h): mpirun forwards it to every rank as it does SIGUSR1.
  if (std::none_of(p.extra_args.begin(), p.extra_args.end(), [](const std::string& x) {
        return x.find("forward_signals") != std::string::npos;
      }))
    a.insert(a.end(), {"--mca", "ess_base_forward_signals", std::to_string(preempt_term_signal())});
  a.insert(a.end(), p.extra_args.begin(), p.extra_args.end());
  for (const auto& [k, v] : p.env) a.insert(a.end(), {"-x", k + "=" + v});
  a.insert(a.end(), {p.wrapper, kWrapperCommand});
  a.insert(a.end(), p.command.begin(), p.command.end());
  return a;
}

// ---------------------------------------------------------------------------------------------
// Failure lines

std::string signal_name(int sig) {
  static const std::map<int, const char*> names = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},       {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},     {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},     {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"},     {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
      {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"},     {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
      {SIGTTOU, "SIGTTOU"}, {SIGURG, "SIGURG"},       {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"},
      {SIGPROF, "SIGPROF"}, {SIGVTALRM, "SIGVTALRM"}, {SIGSYS, "SIGSYS"},   {SIGWINCH, "SIGWINCH"}};
  const auto it = names.find(sig);
  return it != names.end() ? it->second : fmt::format("signal {}", sig);
}

std::string wrapper_failure_line(const std::string& rank, const std::string& host, int status) {
  if (WIFSIGNALED(status))
    return fmt::format("{}rank {} on host {} was killed by signal {} ({})", kMarker, rank, host,
                       WTERMSIG(status), signal_name(WTERMSIG(status)));
  return fmt::format("{}rank {} on host {} exited with code {}", kMarker, rank, host,
                     WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

std::optional<RankFailure> parse_failure_line(const std::string& line) {
  static const std::regex ours(
      R"(\[colossalai run\] rank (\S+) on host (\S+) (?:exited with code (-?\d+)|was killed by signal (\d+) \((\w+)\)))");
  static const std::regex ompi(
      R"(mpirun noticed that process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+))");
  std::smatch m;
  RankFailure f;
  if (std::regex_search(line, m, ours)) {
    f.rank = m[1], f.host = m[2];
    if (m[3].matched) {
      f.exit_code = std::stoi(m[3]);
    } else {
      f.signal = std::stoi(m[4]);
      f.signal_name = m[5];
    }
    return f;
  }
  if (std::regex_search(line, m, ompi)) {
    f.rank = m[1], f.host = m[2];
    f.signal = std::stoi(m[3]);
    f.signal_name = signal_name(f.signal);
    return f;
  }
  return std::nullopt;
}

std::string failure_summary(const RankFailure& f) {
  const std::string what = f.signal
                               ? fmt::format("killed by signal {} ({})", f.signal, f.signal_name)
                               : fmt::format("exit code {}", f.exit_code);
  return fmt::format("colossalai run: rank {} (host {}) failed: {}; all ranks stopped", f.rank,
                     f.host, what);
}

std::string failure_cause(const RankFailure& f) {
  return f.signal ? fmt::format("killed by signal {} ({})", f.signal, f.signal_name)
                  : fmt::format("exit code {}", f.exit_code);
}

std::string describe_attempt_failure(const AttemptFailure& f) {
  if (f.rank)
    return fmt::format("attempt {}: rank {} (host {}): {}", f.attempt, f.rank->rank, f.rank->host,
                       failure_cause(*f.rank));
  return fmt::format("attempt {}: mpirun exited with code {} (no rank named a failure)", f.attempt,
                     f.mpirun_code);
}

// ---------------------------------------------------------------------------------------------
// Restarts of a vit_train job

std::string vit_train_checkpoint_dir(const std::vector<std::string>& command) {
  if (command.empty() || std::filesystem::path(command.front()).filename() != "vit_train")
    return "";
  // vit_train's own options that matter here, parsed as its CLI11 parses them; the rest is
  // left alone.
  CLI::App app;
  app.allow_extras();
  std::string config;
  std::vector<std::string> overrides, resume;
  app.add_option("-c,--config", config);
  app.add_option("--set", overrides);
  app.add_option("--resume", resume)->expected(0, 1);
  std::vector<std::string> args(command.rbegin(), command.rend() - 1);  // CLI11: reversed
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    fail("[run] cannot read the vit_train command's options: {}", e.what());
  }
  if (config.empty()) return "";
  return config::load_config(config, overrides).checkpoint_dir;
}

std::vector<std::string> with_resume(const std::vector<std::string>& command) {
  std::vector<std::string> out;
  for (size_t i = 0; i < command.size(); ++i) {
    const std::string& a = command[i];
    if (i > 0 && a == "--resume") {
      if (i + 1 < command.size() && !command[i + 1].empty() && command[i + 1].front() != '-') ++i;
      continue;
    }
    if (i > 0 && a.rfind("--resume=", 0) == 0) continue;
    out.push_back(a);
  }
  out.push_back("--resume");
  return out;
}

}  // namespace cai::app
