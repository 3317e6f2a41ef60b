/* For the signal tests of `memsnap run`: a command that notes every SIGINT it gets, with who sent
 * it, for a while, then prints them ("SIGINT code=C sender=PID" each) and exits 0.
 *   signal_count READY_FILE SECONDS     (READY_FILE is made once the handler is in place) */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t g_count = 0;
static int g_code[16];
static pid_t g_sender[16];

static void note(int sig, siginfo_t* info, void* context) {
  (void)sig;
  (void)context;
  if (g_count < 16) {
    g_code[g_count] = info->si_code;
    g_sender[g_count] = info->si_pid;
    g_count = g_count + 1;
  }
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  struct sigaction sa = {0};
  sa.sa_sigaction = note;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  const int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) close(fd);
  struct timespec left = {atoi(argv[2]), 0};
  while (nanosleep(&left, &left) != 0) {
  }
  for (int i = 0; i < g_count; ++i) printf("SIGINT code=%d sender=%d\n", g_code[i], (int)g_sender[i]);
  return 0;
}
