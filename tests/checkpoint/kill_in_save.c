// Test harness, loaded with LD_PRELOAD into a rank of a checkpointing job: after an fsync of a
// file whose path contains $KILL_IN_SAVE_PATH, on the rank $KILL_IN_SAVE_RANK
// (OMPI_COMM_WORLD_RANK), the process kills itself with SIGKILL, in the middle of a save, so the
// test sees what a job killed there leaves (tests/apps/test_vit_train_killed_save.sh). The
// library under test is not changed; every other call goes to the real fsync. With
// $KILL_IN_SAVE_ONCE (a file name) it fires only while that file does not exist, creating it
// first (a restarted job then runs through).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int fsync(int fd) {
  static int (*real_fsync)(int) = NULL;
  if (!real_fsync) real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
  const int rc = real_fsync(fd);
  const char* want = getenv("KILL_IN_SAVE_PATH");
  const char* rank = getenv("KILL_IN_SAVE_RANK");
  const char* me = getenv("OMPI_COMM_WORLD_RANK");
  if (want && rank && me && strcmp(rank, me) == 0) {
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, path, sizeof path - 1);
    if (n > 0) {
      path[n] = '\0';
      const char* once = getenv("KILL_IN_SAVE_ONCE");
      if (strstr(path, want) && (!once || access(once, F_OK) != 0)) {
        if (once) {
          FILE* f = fopen(once, "w");
          if (f) fclose(f);
        }
        fprintf(stderr, "kill_in_save: rank %s kills itself after the fsync of %s\n", me, path);
        fflush(stderr);
        raise(SIGKILL);
      }
    }
  }
  return rc;
}
