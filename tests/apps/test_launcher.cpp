// colossalai run's pure parts: hostfile parsing, host selection, master address, the environment
// every rank gets, the mpirun command, failure lines and the command-line parsing.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "cai/core/error.h"
#include "cmd_run.h"
#include "run_preempt.h"

using namespace cai;
using namespace cai::app;

namespace {

// Runs f and expects a cai::Error whose message contains every fragment.
template <typename F>
void expect_error(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no error; expected: " << fragments.front();
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("[run]", 0), 0u) << what;
    for (const auto& frag : fragments)
      EXPECT_NE(what.find(frag), std::string::npos) << "'" << frag << "' not in: " << what;
  }
}

// A hostfile in a temporary directory, removed with the fixture.
class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("cai_launcher_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const auto p = (dir_ / name).string();
    std::ofstream(p) << text;
    return p;
  }
  std::filesystem::path dir_;
};

std::vector<std::string> names(const std::vector<HostEntry>& v) {
  std::vector<std::string> out;
  for (const auto& e : v) out.push_back(e.name);
  return out;
}

// A fake environment for forwarded_env/make_plan.
struct FakeEnv {
  std::map<std::string, std::string> vars;
  Getenv fn() const {
    return [this](const char* n) -> const char* {
      auto it = vars.find(n);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

std::string value_of(const std::vector<std::pair<std::string, std::string>>& env,
                     const std::string& k) {
  for (const auto& [name, v] : env)
    if (name == k) return v;
  return "<absent>";
}

bool has_name(const std::vector<std::pair<std::string, std::string>>& env, const std::string& k) {
  return value_of(env, k) != "<absent>";
}

// The value after `flag` in argv ("<absent>" if the flag is not there).
std::string after(const std::vector<std::string>& argv, const std::string& flag) {
  auto it = std::find(argv.begin(), argv.end(), flag);
  return it == argv.end() || it + 1 == argv.end() ? "<absent>" : *(it + 1);
}

std::vector<std::string> x_values(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == "-x") out.push_back(argv[i + 1]);
  return out;
}

RunOptions basic(int nproc = 2) {
  RunOptions o;
  o.nproc_per_node = nproc;
  o.command = {"./train", "--config", "a.toml"};
  return o;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Hostfile

TEST(Hostfile, CommentsBlankLinesAndTrailingComments) {
  const auto hosts = parse_hostfile(
      "# cluster\n"
      "\n"
      "node1\n"
      "   node2   # the second box\n"
      "\t\n"
      "10.0.0.3 slots=4\n"
      "#node4\n"
      "node5#no space before the comment\r\n",
      "h.txt");
  EXPECT_EQ(names(hosts), (std::vector<std::string>{"node1", "node2", "10.0.0.3", "node5"}));
  EXPECT_EQ(hosts[0].line, 3);
  EXPECT_EQ(hosts[1].line, 4);
  EXPECT_EQ(hosts[2].slots, 4);
  EXPECT_EQ(hosts[0].slots, -1);
  EXPECT_EQ(hosts[3].line, 8);
}

TEST(Hostfile, DuplicateNamesBothLines) {
  expect_error([] { parse_hostfile("a\nb\n\n# x\na\n", "hosts.txt"); },
               {"hosts.txt", "host a", "lines 1 and 5"});
  expect_error([] { parse_hostfile("a\nb slots=2\nb # again\n", "h"); }, {"host b", "2 and 3"});
}

TEST(Hostfile, EmptyIsAnError) {
  expect_error([] { parse_hostfile("", "empty.txt"); }, {"empty.txt", "no hosts"});
  expect_error([] { parse_hostfile("# only\n\n   # comments\n", "c.txt"); }, {"c.txt", "no hosts"});
}

TEST(Hostfile, BadLines) {
  expect_error([] { parse_hostfile("node1 gpus=4\n", "h"); }, {"line 1", "gpus=4", "slots=N"});
  expect_error([] { parse_hostfile("a\nnode:1\n", "h"); }, {"line 2", "node:1"});
  expect_error([] { parse_hostfile("a slots=0\n", "h"); }, {"slots=0"});
}

// Found by the fuzzer (issue 16): slots=2^32 was cut to int and read as 0 (2^32-1 as -1, "not
// given").
TEST(Hostfile, SlotsBeyondIntAreErrors) {
  expect_error([] { parse_hostfile("a slots=4294967296\n", "h"); }, {"line 1", "slots=4294967296"});
  expect_error([] { parse_hostfile("a slots=4294967295\n", "h"); }, {"slots=4294967295"});
  EXPECT_EQ(parse_hostfile("a slots=2147483647\n", "h")[0].slots, 2147483647);
}

TEST_F(TempDir, HostfileFromDiskAndMissingFile) {
  const auto p = write("hosts", "n1\nn2\n");
  EXPECT_EQ(names(read_hostfile(p)), (std::vector<std::string>{"n1", "n2"}));
  const auto missing = (dir_ / "nope.txt").string();
  expect_error([&] { read_hostfile(missing); }, {missing, "not found"});
  expect_error([&] { read_hostfile(write("empty", "\n\n")); }, {"no hosts"});
}

// ---------------------------------------------------------------------------------------------
// Host selection

TEST_F(TempDir, IncludeExcludeKeepHostfileOrder) {
  RunOptions o = basic();
  o.hostfile = write("hosts", "a\nb # x\nc\nd\n");
  EXPECT_EQ(select_hosts(o), (std::vector<std::string>{"a", "b", "c", "d"}));
  o.include = {"d", "b"};
  EXPECT_EQ(select_hosts(o), (std::vector<std::string>{"b", "d"}));
  o.include.clear();
  o.exclude = {"c", "a"};
  EXPECT_EQ(select_hosts(o), (std::vector<std::string>{"b", "d"}));
  o.exclude = {"a", "b", "c", "d"};
  expect_error([&] { select_hosts(o); }, {"leaves no host"});
}

TEST_F(TempDir, IncludeExcludeErrors) {
  RunOptions o = basic();
  o.hostfile = write("hosts", "a\nb\n");
  o.include = {"a"};
  o.exclude = {"b"};
  expect_error([&] { select_hosts(o); }, {"--include a", "--exclude b", "mutually exclusive"});
  o.exclude.clear();
  o.include = {"a", "zed"};
  expect_error([&] { select_hosts(o); }, {"--include", "host zed", "not in hostfile", o.hostfile});
  o.include.clear();
  o.exclude = {"ghost"};
  expect_error([&] { select_hosts(o); }, {"--exclude", "host ghost", "not in hostfile"});

  RunOptions no_file = basic();
  no_file.include = {"a"};
  expect_error([&] { select_hosts(no_file); }, {"--include a", "only with --hostfile"});
  no_file.include.clear();
  no_file.host = {"a", "b"};
  no_file.exclude = {"b"};
  expect_error([&] { select_hosts(no_file); }, {"--exclude b", "only with --hostfile"});
}

TEST_F(TempDir, HostAndHostfileExclusive) {
  RunOptions o = basic();
  o.hostfile = write("hosts", "a\n");
  o.host = {"a"};
  expect_error([&] { select_hosts(o); }, {"--host", "--hostfile", "mutually exclusive"});
}

TEST(Hosts, HostListChecked) {
  RunOptions o = basic();
  o.host = {"n1", "n2", "n1"};
  expect_error([&] { select_hosts(o); }, {"--host lists n1 twice"});
  o.host = {"n1", ""};
  expect_error([&] { select_hosts(o); }, {"--host", "not a host name"});
  o.host = {"n2", "n1"};
  EXPECT_EQ(select_hosts(o), (std::vector<std::string>{"n2", "n1"}));
  EXPECT_TRUE(select_hosts(basic()).empty());  // this machine only
}

TEST_F(TempDir, NumNodesTakesTheFirstK) {
  RunOptions o = basic();
  o.hostfile = write("hosts", "a\nb\nc\n");
  o.num_nodes = 2;
  EXPECT_EQ(select_hosts(o), (std::vector<std::string>{"a", "b"}));
  o.exclude = {"a"};
  EXPECT_EQ(select_hosts(o), (std::vector<std::string>{"b", "c"}));
  o.exclude.clear();
  o.num_nodes = 4;
  expect_error([&] { select_hosts(o); }, {"--num_nodes 4", "only 3 host(s)"});
  o.num_nodes = 0;
  expect_error([&] { select_hosts(o); }, {"--num_nodes 0"});
  RunOptions local = basic();
  local.num_nodes = 1;
  EXPECT_TRUE(select_hosts(local).empty());
  local.num_nodes = 2;
  expect_error([&] { select_hosts(local); }, {"--num_nodes 2", "without --host"});
}

TEST(Hosts, MasterAddrDefault) {
  RunOptions o = basic();
  EXPECT_EQ(master_addr_for(o, {}), "127.0.0.1");
  EXPECT_EQ(master_addr_for(o, {"node7"}), "127.0.0.1");
  EXPECT_EQ(master_addr_for(o, {"node7", "node8"}), "node7");
  o.master_addr = "10.1.2.3";
  EXPECT_EQ(master_addr_for(o, {"node7", "node8"}), "10.1.2.3");
  EXPECT_EQ(master_addr_for(o, {}), "10.1.2.3");
}

// ---------------------------------------------------------------------------------------------
// Environment

TEST(Env, OnlyWhatTheJobNeeds) {
  FakeEnv e;
  e.vars = {{"SECRET_TOKEN", "hunter2"},
            {"HOME", "/root"},
            {"PATH", "/usr/bin:/bin"},
            {"DATA", "/data"},
            {"AWS_SECRET", "x"},
            {"LD_LIBRARY_PATH", "/opt"},
            {"CAI_COLLECTIVE_TIMEOUT", "30"}};
  RunOptions o = basic(2);
  o.master_port = 12345;
  const auto env = forwarded_env(o, "10.0.0.1", e.fn(), 8);
  EXPECT_EQ(value_of(env, "MASTER_ADDR"), "10.0.0.1");
  EXPECT_EQ(value_of(env, "MASTER_PORT"), "12345");
  EXPECT_EQ(value_of(env, "CAI_NPROC_PER_NODE"), "2");
  EXPECT_EQ(value_of(env, "CAI_NUM_THREADS"), "4");  // 8 cores / 2 ranks
  EXPECT_EQ(value_of(env, "DATA"), "/data");
  EXPECT_EQ(value_of(env, "PATH"), "/usr/bin:/bin");
  EXPECT_EQ(value_of(env, "LD_LIBRARY_PATH"), "/opt");
  EXPECT_EQ(value_of(env, "CAI_COLLECTIVE_TIMEOUT"), "30");
  EXPECT_FALSE(has_name(env, "SECRET_TOKEN"));
  EXPECT_FALSE(has_name(env, "AWS_SECRET"));
  EXPECT_FALSE(has_name(env, "HOME"));
  EXPECT_FALSE(has_name(env, "OMP_NUM_THREADS"));
  EXPECT_EQ(env.size(), 8u);
}

TEST(Env, ThreadCount) {
  FakeEnv e;
  RunOptions o = basic(4);
  EXPECT_EQ(value_of(forwarded_env(o, "a", e.fn(), 2), "CAI_NUM_THREADS"), "1");  // max(1, 0)
  EXPECT_EQ(value_of(forwarded_env(o, "a", e.fn(), 16), "CAI_NUM_THREADS"), "4");
  e.vars = {{"OMP_NUM_THREADS", "3"}};
  auto env = forwarded_env(o, "a", e.fn(), 16);
  EXPECT_EQ(value_of(env, "OMP_NUM_THREADS"), "3");
  EXPECT_FALSE(has_name(env, "CAI_NUM_THREADS"));  // the user's choice stands
  e.vars = {{"CAI_NUM_THREADS", "5"}};
  env = forwarded_env(o, "a", e.fn(), 16);
  EXPECT_EQ(value_of(env, "CAI_NUM_THREADS"), "5");
  EXPECT_FALSE(has_name(env, "OMP_NUM_THREADS"));
}

TEST(Env, UserVariables) {
  FakeEnv e;
  e.vars = {{"NCCL_DEBUG", "INFO"}, {"PATH", "/bin"}, {"SECRET_TOKEN", "s"}};
  RunOptions o = basic();
  o.env = {"NCCL_DEBUG", "FOO=bar=baz", "PATH=/opt/bin", "EMPTY="};
  const auto env = forwarded_env(o, "m", e.fn(), 2);
  EXPECT_EQ(value_of(env, "NCCL_DEBUG"), "INFO");
  EXPECT_EQ(value_of(env, "FOO"), "bar=baz");
  EXPECT_EQ(value_of(env, "PATH"), "/opt/bin");  // replaced, not duplicated
  EXPECT_EQ(value_of(env, "EMPTY"), "");
  EXPECT_EQ(std::count_if(env.begin(), env.end(), [](auto& kv) { return kv.first == "PATH"; }), 1);
  EXPECT_FALSE(has_name(env, "SECRET_TOKEN"));
  o.env = {"UNSET_THING"};
  expect_error([&] { forwarded_env(o, "m", e.fn(), 2); }, {"-x UNSET_THING", "not set"});
  o.env = {"1BAD=x"};
  expect_error([&] { forwarded_env(o, "m", e.fn(), 2); }, {"1BAD", "not a variable name"});
}

// ---------------------------------------------------------------------------------------------
// Quoting

TEST(Shell, SplitWords) {
  EXPECT_EQ(split_shell_words("  --mca btl_tcp_if_include eth0  "),
            (std::vector<std::string>{"--mca", "btl_tcp_if_include", "eth0"}));
  EXPECT_EQ(
      split_shell_words(R"(--mca plm_rsh_args '-i key -o X=1' "a b\"c" d\ e '')"),
      (std::vector<std::string>{"--mca", "plm_rsh_args", "-i key -o X=1", "a b\"c", "d e", ""}));
  EXPECT_TRUE(split_shell_words("").empty());
  expect_error([] { split_shell_words("--x 'open"); }, {"unterminated"});
  expect_error([] { split_shell_words("--x \"open"); }, {"unterminated"});
}

TEST(Shell, Quote) {
  EXPECT_EQ(shell_quote("plain-arg_1.2/x=y:z,w"), "plain-arg_1.2/x=y:z,w");
  EXPECT_EQ(shell_quote("-p 2222"), "'-p 2222'");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("it's"), R"('it'\''s')");
  EXPECT_EQ(shell_join({"a", "b c"}), "a 'b c'");
  // Round trip through the splitter.
  const std::vector<std::string> v{"x y", "it's", "$HOME", "", "a\"b"};
  EXPECT_EQ(split_shell_words(shell_join(v)), v);
}

// ---------------------------------------------------------------------------------------------
// The mpirun command

TEST(Mpirun, SingleHost) {
  FakeEnv e;
  e.vars = {{"PATH", "/usr/bin"}, {"SECRET_TOKEN", "hunter2"}};
  LaunchPlan p = make_plan(basic(2), e.fn(), 2);
  p.mpirun = "/usr/bin/mpirun";
  p.wrapper = "/opt/cai/colossalai";
  const auto a = build_mpirun_argv(p);
  const std::vector<std::string> expected{"/usr/bin/mpirun",
                                          "--oversubscribe",
                                          "-np",
                                          "2",
                                          "--host",
                                          "localhost:2",
                                          "--bind-to",
                                          "none",
                                          "--mca",
                                          "ess_base_forward_signals",
                                          std::to_string(SIGRTMIN + 5),
                                          "-x",
                                          "MASTER_ADDR=127.0.0.1",
                                          "-x",
                                          "MASTER_PORT=29500",
                                          "-x",
                                          "CAI_NPROC_PER_NODE=2",
                                          "-x",
                                          "CAI_NUM_THREADS=1",
                                          "-x",
                                          "PATH=/usr/bin",
                                          "/opt/cai/colossalai",
                                          "_rank_wrapper",
                                          "./train",
                                          "--config",
                                          "a.toml"};
  EXPECT_EQ(a, expected);
  for (const auto& s : a) EXPECT_EQ(s.find("SECRET_TOKEN"), std::string::npos) << s;
  for (const auto& s : a) EXPECT_EQ(s.find("hunter2"), std::string::npos) << s;
  EXPECT_EQ(std::count(a.begin(), a.end(), "--tag-output"), 0);
  p.as_root = true;
  EXPECT_EQ(build_mpirun_argv(p)[1], "--allow-run-as-root");
}

TEST(Mpirun, TwoHostsWithSshPort) {
  FakeEnv e;
  RunOptions o = basic(2);
  o.host = {"node1", "node2"};
  o.ssh_port = 2222;
  LaunchPlan p = make_plan(o, e.fn(), 4);
  p.wrapper = "/w";
  const auto a = build_mpirun_argv(p);
  EXPECT_EQ(after(a, "-np"), "4");
  EXPECT_EQ(after(a, "--host"), "node1:2,node2:2");
  EXPECT_EQ(after(a, "--mca"), "plm_rsh_args");
  EXPECT_EQ(after(a, "plm_rsh_args"), "-p 2222");
  const auto xs = x_values(a);
  EXPECT_NE(std::find(xs.begin(), xs.end(), "MASTER_ADDR=node1"), xs.end());
  EXPECT_NE(std::find(xs.begin(), xs.end(), "CAI_NUM_THREADS=2"), xs.end());
  EXPECT_EQ(shell_join(a).find("--mca plm_rsh_args '-p 2222'") != std::string::npos, true);
  // No ssh port: no plm_rsh_args (the only --mca left is SIGTERM's forwarded stand-in).
  o.ssh_port = 0;
  p = make_plan(o, e.fn(), 4);
  EXPECT_EQ(after(build_mpirun_argv(p), "--mca"), "ess_base_forward_signals");
  EXPECT_EQ(after(build_mpirun_argv(p), "plm_rsh_args"), "<absent>");
}

TEST(Mpirun, ExtraLaunchArgsAndUserEnv) {
  FakeEnv e;
  e.vars = {{"NCCL_DEBUG", "WARN"}, {"SECRET_TOKEN", "x"}};
  RunOptions o = basic(1);
  o.extra_launch_args = "--mca btl_tcp_if_include 'eth0' --bind-to core";
  o.env = {"NCCL_DEBUG", "MY_FLAG=a b"};
  LaunchPlan p = make_plan(o, e.fn(), 2);
  p.wrapper = "/w";
  const auto a = build_mpirun_argv(p);
  EXPECT_EQ(after(a, "btl_tcp_if_include"), "eth0");
  EXPECT_EQ(after(a, "--bind-to"), "core");  // ours is left out when the user binds
  EXPECT_EQ(std::count(a.begin(), a.end(), "--bind-to"), 1);
  const auto xs = x_values(a);
  EXPECT_NE(std::find(xs.begin(), xs.end(), "NCCL_DEBUG=WARN"), xs.end());
  EXPECT_NE(std::find(xs.begin(), xs.end(), "MY_FLAG=a b"), xs.end());
  for (const auto& x : xs) EXPECT_EQ(x.rfind("SECRET_TOKEN", 0), std::string::npos);
  // The program and its own flags come last, unchanged, after the wrapper.
  auto w = std::find(a.begin(), a.end(), "_rank_wrapper");
  ASSERT_NE(w, a.end());
  EXPECT_EQ(std::vector<std::string>(w + 1, a.end()), o.command);
}

TEST(Mpirun, RealEnvironmentSecretNotForwarded) {
  setenv("SECRET_TOKEN", "do-not-leak", 1);
  RunOptions o = basic(2);
  LaunchPlan p = make_plan(
      o, [](const char* n) { return std::getenv(n); }, 2);
  p.wrapper = "/w";
  const std::string cmd = shell_join(build_mpirun_argv(p));
  EXPECT_EQ(cmd.find("SECRET_TOKEN"), std::string::npos) << cmd;
  EXPECT_EQ(cmd.find("do-not-leak"), std::string::npos) << cmd;
  unsetenv("SECRET_TOKEN");
}

TEST(Mpirun, PlanChecks) {
  FakeEnv e;
  RunOptions o = basic(0);
  expect_error([&] { make_plan(o, e.fn(), 2); }, {"--nproc_per_node 0"});
  o = basic();
  o.master_port = 70000;
  expect_error([&] { make_plan(o, e.fn(), 2); }, {"--master_port 70000"});
  o = basic();
  o.command.clear();
  expect_error([&] { make_plan(o, e.fn(), 2); }, {"no program"});
  o.command = {"--bogus", "prog"};
  expect_error([&] { make_plan(o, e.fn(), 2); }, {"unknown option --bogus"});
  o.command = {"--", "prog", "-v"};
  EXPECT_EQ(make_plan(o, e.fn(), 2).command, (std::vector<std::string>{"prog", "-v"}));
}

// ---------------------------------------------------------------------------------------------
// Failure lines

TEST(Failure, WrapperLinesRoundTrip) {
  const std::string exited = wrapper_failure_line("3", "node1", 3 << 8);  // exit(3)
  EXPECT_EQ(exited, "[colossalai run] rank 3 on host node1 exited with code 3");
  auto f = parse_failure_line("[node1:123] " + exited);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->rank, "3");
  EXPECT_EQ(f->host, "node1");
  EXPECT_EQ(f->exit_code, 3);
  EXPECT_EQ(failure_summary(*f),
            "colossalai run: rank 3 (host node1) failed: exit code 3; all ranks stopped");

  const std::string killed = wrapper_failure_line("1", "h", SIGKILL);  // killed by signal 9
  EXPECT_EQ(killed, "[colossalai run] rank 1 on host h was killed by signal 9 (SIGKILL)");
  f = parse_failure_line(killed);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->signal, 9);
  EXPECT_EQ(failure_summary(*f),
            "colossalai run: rank 1 (host h) failed: killed by signal 9 (SIGKILL); all ranks "
            "stopped");
}

TEST(Failure, OpenMpiLineAndNoise) {
  auto f = parse_failure_line(
      "mpirun noticed that process rank 2 with PID 4242 on node box2 exited on signal 11 "
      "(Segmentation fault).");
  ASSERT_TRUE(f);
  EXPECT_EQ(f->rank, "2");
  EXPECT_EQ(f->host, "box2");
  EXPECT_EQ(f->signal_name, "SIGSEGV");
  EXPECT_FALSE(parse_failure_line("epoch 1 loss 0.3"));
  EXPECT_FALSE(parse_failure_line("  Exit code:    3"));
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(signal_name(1000), "signal 1000");
}

// ---------------------------------------------------------------------------------------------
// Command line

namespace {
// Parses `colossalai ARGS` with the run subcommand set up.
RunOptions parse(std::vector<std::string> args) {
  CLI::App app;
  app.require_subcommand(1);
  RunOptions o;
  setup_run(app, o);
  args.insert(args.begin(), "colossalai");
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return o;
}
}  // namespace

TEST(Cli, ProgramArgumentsPassUnchanged) {
  RunOptions o = parse({"run", "--nproc_per_node", "2", "-x", "A", "-x", "B=1", "--host", "n1,n2",
                        "prog", "--nproc_per_node", "9", "-x", "--host", "zz"});
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.env, (std::vector<std::string>{"A", "B=1"}));
  EXPECT_EQ(o.host, (std::vector<std::string>{"n1", "n2"}));
  EXPECT_EQ(o.command,
            (std::vector<std::string>{"prog", "--nproc_per_node", "9", "-x", "--host", "zz"}));
  EXPECT_FALSE(o.rank_wrapper);
}

TEST(Cli, DoubleDashAndDefaults) {
  RunOptions o = parse({"run", "--nproc_per_node=1", "--", "prog", "--help"});
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.timeout, 0);
  FakeEnv e;
  EXPECT_EQ(make_plan(o, e.fn(), 2).command, (std::vector<std::string>{"prog", "--help"}));
}

TEST(Cli, Errors) {
  EXPECT_THROW(parse({"run", "prog"}), CLI::ParseError);  // --nproc_per_node is required
  // Flag combinations are checked by select_hosts, whose messages name the values.
  RunOptions o = parse({"run", "--nproc_per_node", "2", "--include", "a", "--exclude", "b", "p"});
  expect_error([&] { select_hosts(o); }, {"--include a", "--exclude b", "mutually exclusive"});
  o = parse({"run", "--nproc_per_node", "2", "--host", "a", "--hostfile", "f", "p"});
  expect_error([&] { select_hosts(o); }, {"--host", "--hostfile f", "mutually exclusive"});
  EXPECT_THROW(parse({"run", "--nproc_per_node", "0", "p"}), CLI::ParseError);
  EXPECT_THROW(parse({"run", "--nproc_per_node", "1", "--ssh-port", "0", "p"}), CLI::ParseError);
}

TEST(Cli, RankWrapper) {
  RunOptions o = parse({"_rank_wrapper", "prog", "--flag", "x"});
  EXPECT_TRUE(o.rank_wrapper);
  EXPECT_EQ(o.command, (std::vector<std::string>{"prog", "--flag", "x"}));
}

TEST(Hostfile, ShippedExampleParses) {
  const std::string path = std::string(CAI_TEST_DATA_DIR) + "/../../hostfiles/example.txt";
  const auto hosts = read_hostfile(path);
  EXPECT_EQ(names(hosts), (std::vector<std::string>{"node1", "node2", "node3", "10.0.0.5"}));
  EXPECT_EQ(hosts[2].slots, 8);
}

// --max_restarts: which checkpoint.dir a vit_train command names, the restarted command, and the
// failure list's lines.
TEST(Restart, VitTrainCheckpointDir) {
  const std::string cfg =
      std::string(CAI_TEST_DATA_DIR) + "/../../apps/vit_train/configs/fmnist_tiny.toml";
  EXPECT_EQ(vit_train_checkpoint_dir({"build/apps/vit_train", "--config", cfg, "--set",
                                      "checkpoint.dir=/tmp/ck", "--set", "train.num_epochs=1"}),
            "/tmp/ck");
  EXPECT_EQ(vit_train_checkpoint_dir({"vit_train", "-c", cfg, "--resume", "/x/step-000000002",
                                      "--set=checkpoint.dir=ck2", "--trace", "t.json"}),
            "ck2");
  EXPECT_EQ(vit_train_checkpoint_dir({"vit_train", "--config", cfg}), "");  // no checkpoint.dir
  EXPECT_EQ(vit_train_checkpoint_dir({"./train", "--config", cfg, "--set", "checkpoint.dir=x"}),
            "");  // not vit_train
  EXPECT_THROW(vit_train_checkpoint_dir({"vit_train", "--config", "/nonexistent.toml"}), Error);
}

TEST(Restart, WithResume) {
  using V = std::vector<std::string>;
  EXPECT_EQ(with_resume({"vit_train", "--config", "c.toml"}),
            (V{"vit_train", "--config", "c.toml", "--resume"}));
  // A --resume of the first start (a checkpoint elsewhere, or one step) gives way to the newest.
  EXPECT_EQ(with_resume({"vit_train", "--resume", "/a/step-2", "--config", "c.toml"}),
            (V{"vit_train", "--config", "c.toml", "--resume"}));
  EXPECT_EQ(with_resume({"vit_train", "--resume", "--config", "c.toml", "--resume=/b"}),
            (V{"vit_train", "--config", "c.toml", "--resume"}));
}

TEST(Restart, FailureLines) {
  RankFailure k{"1", "h", -1, 9, "SIGKILL"};
  EXPECT_EQ(failure_cause(k), "killed by signal 9 (SIGKILL)");
  EXPECT_EQ(describe_attempt_failure({2, k, 137}),
            "attempt 2: rank 1 (host h): killed by signal 9 (SIGKILL)");
  EXPECT_EQ(describe_attempt_failure({1, RankFailure{"0", "n", 3, 0, ""}, 3}),
            "attempt 1: rank 0 (host n): exit code 3");
  EXPECT_EQ(describe_attempt_failure({3, std::nullopt, 1}),
            "attempt 3: mpirun exited with code 1 (no rank named a failure)");
}

TEST(Restart, Cli) {
  RunOptions o = parse({"run", "--nproc_per_node", "2", "p"});
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_EQ(o.monitor_interval, 5);
  o = parse({"run", "--nproc_per_node", "2", "--max_restarts", "3", "--monitor_interval", "0.5",
             "p", "--max_restarts", "9"});
  EXPECT_EQ(o.max_restarts, 3);
  EXPECT_EQ(o.monitor_interval, 0.5);
  EXPECT_EQ(o.command, (std::vector<std::string>{"p", "--max_restarts", "9"}));
  EXPECT_THROW(parse({"run", "--nproc_per_node", "1", "--max_restarts", "-1", "p"}),
               CLI::ParseError);
  EXPECT_THROW(parse({"run", "--nproc_per_node", "1", "--monitor_interval", "0", "p"}),
               CLI::ParseError);
}

// ---------------------------------------------------------------------------------------------
// Preemption (run_preempt.h)

TEST(Preempt, SignalsOnTheirWayToTheProgram) {
  EXPECT_TRUE(is_preempt_signal(SIGTERM));
  EXPECT_TRUE(is_preempt_signal(SIGUSR1));
  EXPECT_FALSE(is_preempt_signal(SIGINT));
  EXPECT_FALSE(is_preempt_signal(SIGHUP));
  // mpirun would kill the job on SIGTERM: it travels as SIGRTMIN+5, SIGUSR1 as itself.
  EXPECT_EQ(preempt_signal_to_mpirun(SIGTERM), SIGRTMIN + 5);
  EXPECT_EQ(preempt_signal_to_mpirun(SIGUSR1), SIGUSR1);
  EXPECT_EQ(preempt_signal_to_program(preempt_signal_to_mpirun(SIGTERM)), SIGTERM);
  EXPECT_EQ(preempt_signal_to_program(SIGUSR1), SIGUSR1);
  EXPECT_EQ(preempt_signal_to_program(SIGUSR2), 0);
  EXPECT_EQ(preempt_signal_to_program(SIGTERM), 0);  // mpirun's own stop: not a preemption
}

TEST(Preempt, UserForwardSignalsReplaceOurs) {
  FakeEnv e;
  RunOptions o = basic(1);
  o.extra_launch_args = "--mca ess_base_forward_signals SIGURG";
  LaunchPlan p = make_plan(o, e.fn(), 2);
  p.wrapper = "/w";
  const auto a = build_mpirun_argv(p);
  EXPECT_EQ(std::count(a.begin(), a.end(), "ess_base_forward_signals"), 1);
  EXPECT_EQ(after(a, "ess_base_forward_signals"), "SIGURG");
}

TEST(Preempt, StoppedLinesRoundTripAndAreNotFailures) {
  const int exited143 = 143 << 8;  // waitpid's status of exit(143)
  ASSERT_TRUE(WIFEXITED(exited143) && WEXITSTATUS(exited143) == 143);
  const std::string a = wrapper_stopped_line("1", "node2", SIGTERM, exited143);
  EXPECT_EQ(a,
            "[colossalai run] rank 1 on host node2 stopped on request (SIGTERM): exited with "
            "code 143");
  const auto r = parse_stopped_line("mpirun says: " + a);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rank, "1");
  EXPECT_EQ(r->host, "node2");
  EXPECT_EQ(r->asked, "SIGTERM");
  EXPECT_EQ(r->exit_code, 143);
  EXPECT_EQ(r->signal, 0);
  EXPECT_FALSE(parse_failure_line(a));  // a rank that was asked to stop did not fail
  const int killed = SIGKILL;           // waitpid's status of a process killed by SIGKILL
  ASSERT_TRUE(WIFSIGNALED(killed));
  const auto k = parse_stopped_line(wrapper_stopped_line("0", "h", SIGUSR1, killed));
  ASSERT_TRUE(k);
  EXPECT_EQ(k->asked, "SIGUSR1");
  EXPECT_EQ(k->exit_code, -1);
  EXPECT_EQ(k->signal, SIGKILL);
  EXPECT_FALSE(parse_stopped_line("[colossalai run] rank 0 on host h exited with code 143"));
}

TEST(Preempt, Summary) {
  auto rank = [](const char* r, int code, int sig) {
    StoppedRank s;
    s.rank = r, s.host = "h", s.asked = "SIGTERM", s.exit_code = code, s.signal = sig;
    return s;
  };
  // Lines come in any order; ranks are listed in rank order, grouped by how they ended.
  EXPECT_EQ(
      preempt_summary(SIGTERM, {rank("10", 143, 0), rank("2", 143, 0), rank("0", 143, 0)}, 3, 30),
      "colossalai run: stopped on request (SIGTERM): every rank (3 of 3) stopped within the "
      "grace period (ranks 0, 2, 10: exited with code 143)");
  EXPECT_EQ(preempt_summary(SIGUSR1, {rank("1", 1, 0), rank("0", -1, SIGKILL)}, 4, 5),
            "colossalai run: stopped on request (SIGUSR1): 2 of 4 ranks stopped within the grace "
            "period (rank 1: exited with code 1; rank 0: killed by signal 9 (SIGKILL)); the others "
            "were stopped by force after --grace_period 5 s");
  EXPECT_EQ(preempt_summary(SIGTERM, {}, 2, 1),
            "colossalai run: stopped on request (SIGTERM): 0 of 2 ranks stopped within the grace "
            "period; the others were stopped by force after --grace_period 1 s");
}
