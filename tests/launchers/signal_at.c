/* Fault injection for the interrupt tests, preloaded into memsnap (LD_PRELOAD): the process sends
 * itself a signal right after a chosen call, at the moment a command puts its output in place.
 *   MEMSNAP_TEST_SIGNAL_ON     "rename" or "mkdir": the call
 *   MEMSNAP_TEST_SIGNAL_PATH   a text its path (a rename's destination) contains
 *   MEMSNAP_TEST_SIGNAL_COUNT  after the Nth such call (default 1)
 *   MEMSNAP_TEST_SIGNAL        the signal's number (default SIGTERM)
 *   MEMSNAP_TEST_SIGNAL_RANK   only in this MPI rank (default 0; a singleton is rank 0) */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

static int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  return v != NULL && *v != '\0' ? atoi(v) : fallback;
}

static void after_call(const char* call, const char* path) {
  static int seen = 0;
  const char* on = getenv("MEMSNAP_TEST_SIGNAL_ON");
  const char* part = getenv("MEMSNAP_TEST_SIGNAL_PATH");
  if (on == NULL || strcmp(on, call) != 0 || path == NULL) return;
  if (part != NULL && strstr(path, part) == NULL) return;
  const char* rank = getenv("OMPI_COMM_WORLD_RANK");
  if ((rank != NULL ? atoi(rank) : 0) != env_int("MEMSNAP_TEST_SIGNAL_RANK", 0)) return;
  if (__atomic_add_fetch(&seen, 1, __ATOMIC_SEQ_CST) == env_int("MEMSNAP_TEST_SIGNAL_COUNT", 1)) {
    kill(getpid(), env_int("MEMSNAP_TEST_SIGNAL", SIGTERM));
  }
}

int rename(const char* from, const char* to) {
  int (*real)(const char*, const char*) = (int (*)(const char*, const char*))dlsym(RTLD_NEXT, "rename");
  const int rc = real(from, to);
  after_call("rename", to);
  return rc;
}

int mkdir(const char* path, mode_t mode) {
  int (*real)(const char*, mode_t) = (int (*)(const char*, mode_t))dlsym(RTLD_NEXT, "mkdir");
  const int rc = real(path, mode);
  after_call("mkdir", path);
  return rc;
}
