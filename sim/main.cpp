// colossalai-sim: for now only reports the SimGrid it links; the schedule replay lands with the
// simulator issue.
#include <simgrid/engine.h>
#include <simgrid/version.h>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  int major = 0, minor = 0, patch = 0;
  sg_version_get(&major, &minor, &patch);
  if (argc > 1 && std::strcmp(argv[1], "--version") == 0) {
    std::printf("colossalai-sim (SimGrid %d.%d.%d)\n", major, minor, patch);
    return 0;
  }
  std::fprintf(stderr,
               "colossalai-sim: the schedule replay is not implemented yet (SimGrid %d.%d.%d "
               "linked); try --version\n",
               major, minor, patch);
  return 2;
}
