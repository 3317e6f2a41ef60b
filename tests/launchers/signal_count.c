/* For the signal tests of `memsnap run`: a command that notes every SIGINT and SIGTERM it gets,
 * with who sent it, for a while, then prints them ("SIGINT code=C sender=PID" each, to NOTES_FILE
 * when given, else to standard output) and exits 0.
 *   signal_count READY_FILE SECONDS [NOTES_FILE]   (READY_FILE is made once it listens) */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t g_count = 0;
static int g_signal[16];
static int g_code[16];
static pid_t g_sender[16];

static void note(int sig, siginfo_t* info, void* context) {
  (void)context;
  if (g_count < 16) {
    g_signal[g_count] = sig;
    g_code[g_count] = info->si_code;
    g_sender[g_count] = info->si_pid;
    g_count = g_count + 1;
  }
}

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) return 2;
  struct sigaction sa = {0};
  sa.sa_sigaction = note;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  const int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) close(fd);
  struct timespec left = {atoi(argv[2]), 0};
  while (nanosleep(&left, &left) != 0) {
  }
  FILE* out = argc == 4 ? fopen(argv[3], "w") : stdout;
  if (out == NULL) return 1;
  for (int i = 0; i < g_count; ++i) {
    fprintf(out, "%s code=%d sender=%d\n", g_signal[i] == SIGINT ? "SIGINT" : "SIGTERM", g_code[i], (int)g_sender[i]);
  }
  fclose(out);
  return 0;
}
