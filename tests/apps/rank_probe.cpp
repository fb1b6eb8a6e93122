// rank_probe: a stand-in program for `colossalai run` tests. No MPI calls: the rank comes from
// OMPI_COMM_WORLD_RANK (else RANK, else 0).
//
//   --print                      print "rank R of N host H env MASTER_ADDR=.. MASTER_PORT=.."
//   --env NAME                   also print NAME (repeatable; "<unset>" when unset)
//   --exit-on-rank R --code C    rank R exits with code C (default 1)
//   --sleep-forever-on-rank R    rank R sleeps until killed
//   --signal-on-rank R [--signal SIG]  rank R kills itself with SIG (name or number; KILL)
//   --ignore-term                ignore SIGTERM (tests the launcher's SIGKILL escalation)
//   --sleep SECONDS              every other rank sleeps this long, then exits 0
//   --delay SECONDS              the failing rank waits this long before failing
#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

int parse_signal(const std::string& s) {
  if (!s.empty() && std::isdigit(static_cast<unsigned char>(s[0]))) return std::atoi(s.c_str());
  const std::string n = s.rfind("SIG", 0) == 0 ? s.substr(3) : s;
  const std::pair<const char*, int> table[] = {
      {"KILL", SIGKILL}, {"TERM", SIGTERM}, {"SEGV", SIGSEGV}, {"ABRT", SIGABRT},
      {"INT", SIGINT},   {"HUP", SIGHUP},   {"USR1", SIGUSR1}, {"BUS", SIGBUS}};
  for (const auto& [name, sig] : table)
    if (n == name) return sig;
  std::fprintf(stderr, "rank_probe: unknown signal %s\n", s.c_str());
  std::exit(2);
}

void sleep_s(double s) {
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

}  // namespace

int main(int argc, char** argv) {
  bool print = false, ignore_term = false;
  std::vector<std::string> names = {"MASTER_ADDR", "MASTER_PORT"};
  int exit_rank = -1, code = 1, forever_rank = -1, signal_rank = -1, sig = SIGKILL;
  double sleep = 0, delay = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "rank_probe: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--print")
      print = true;
    else if (a == "--env")
      names.push_back(value());
    else if (a == "--exit-on-rank")
      exit_rank = std::atoi(value().c_str());
    else if (a == "--code")
      code = std::atoi(value().c_str());
    else if (a == "--sleep-forever-on-rank")
      forever_rank = std::atoi(value().c_str());
    else if (a == "--signal-on-rank")
      signal_rank = std::atoi(value().c_str());
    else if (a == "--signal")
      sig = parse_signal(value());
    else if (a == "--ignore-term")
      ignore_term = true;
    else if (a == "--sleep")
      sleep = std::atof(value().c_str());
    else if (a == "--delay")
      delay = std::atof(value().c_str());
    else {
      std::fprintf(stderr, "rank_probe: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  const int rank = env_int("OMPI_COMM_WORLD_RANK", env_int("RANK", 0));
  const int size = env_int("OMPI_COMM_WORLD_SIZE", env_int("WORLD_SIZE", 1));
  if (ignore_term) signal(SIGTERM, SIG_IGN);
  if (print) {
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    std::string line =
        "rank " + std::to_string(rank) + " of " + std::to_string(size) + " host " + host + " env";
    for (const auto& n : names) {
      const char* v = std::getenv(n.c_str());
      line += " " + n + "=" + (v ? v : "<unset>");
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  if (rank == forever_rank)
    for (;;) pause();
  if (rank == exit_rank) {
    sleep_s(delay);
    return code;
  }
  if (rank == signal_rank) {
    sleep_s(delay);
    signal(sig, SIG_DFL);
    kill(getpid(), sig);
    for (;;) pause();
  }
  sleep_s(sleep);
  return 0;
}
