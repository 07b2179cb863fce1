/* LD_PRELOAD shim for scripts/qemu_avx2.sh: keeps every program that a process running under
 * qemu-user starts running under qemu-user too.
 *
 * qemu-user emulates one process; a program it executes (execve) runs natively on the host, with
 * the host's CPUID and instructions. Criterion starts each test in a fresh process by executing
 * the test binary again (BoxFort: fork, then execve of /proc/self/exe), so without this shim the
 * tests themselves would run natively and an AVX-512 instruction in them would go unnoticed.
 *
 * Loaded into the emulated process (LD_PRELOAD, which qemu passes to it), this replaces execve,
 * execv, execvp and execvpe: an x86-64 ELF program is executed as
 *     $XTE_QEMU_BIN -cpu $XTE_QEMU_CPU -0 <argv[0]> <program> <argv[1]...>
 * and anything else (a script, qemu itself) as asked. With XTE_QEMU_SHIM_LOG set, each program it
 * wraps is appended to that file (the script checks that Criterion's workers were wrapped). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

typedef int (*execve_fn)(const char *, char *const[], char *const[]);

static execve_fn real_execve(void) {
  static execve_fn fn;
  if (!fn) fn = (execve_fn)dlsym(RTLD_NEXT, "execve");
  return fn;
}

/* An x86-64 ELF file (ELFCLASS64, EM_X86_64), not qemu itself: its real path into real (the
 * emulated process's /proc/self/exe, which qemu resolves to the program it runs, would be qemu
 * itself to the new process). */
static int wrap_this(const char *path, const char *qemu, char *real) {
  unsigned char h[20];
  char q[PATH_MAX];
  ssize_t n;
  int fd;
  if (!realpath(path, real)) return 0;
  fd = open(real, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  n = read(fd, h, sizeof h);
  close(fd);
  if (n != (ssize_t)sizeof h || memcmp(h, "\177ELF", 4) != 0 || h[4] != 2 || h[18] != 62 ||
      h[19] != 0)
    return 0;
  if (realpath(qemu, q) && strcmp(real, q) == 0) return 0;
  return 1;
}

static void log_wrap(const char *path) {
  const char *log = getenv("XTE_QEMU_SHIM_LOG");
  int fd;
  if (!log || !*log) return;
  fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  if (write(fd, path, strlen(path)) < 0 || write(fd, "\n", 1) < 0) {
  }
  close(fd);
}

int execve(const char *path, char *const argv[], char *const envp[]) {
  const char *qemu = getenv("XTE_QEMU_BIN"), *cpu = getenv("XTE_QEMU_CPU");
  execve_fn real = real_execve();
  size_t argc = 0, i;
  char **nargv, prog[PATH_MAX];
  if (!real) {
    errno = ENOSYS;
    return -1;
  }
  if (!qemu || !*qemu || !cpu || !*cpu || !wrap_this(path, qemu, prog))
    return real(path, argv, envp);
  while (argv[argc]) argc++;
  nargv = calloc(argc + 7, sizeof *nargv);
  if (!nargv) {
    errno = ENOMEM;
    return -1;
  }
  nargv[0] = (char *)qemu;
  nargv[1] = (char *)"-cpu";
  nargv[2] = (char *)cpu;
  nargv[3] = (char *)"-0";
  nargv[4] = (char *)(argc ? argv[0] : path);
  nargv[5] = prog;
  for (i = 1; i < argc; i++) nargv[5 + i] = argv[i];
  log_wrap(prog);
  real(qemu, nargv, envp);
  i = (size_t)errno;
  free(nargv);
  errno = (int)i;
  return -1;
}

int execv(const char *path, char *const argv[]) {
  return execve(path, argv, environ);
}

int execvpe(const char *file, char *const argv[], char *const envp[]) {
  const char *p = getenv("PATH");
  char buf[4096];
  int saw_eacces = 0;
  if (!*file) {
    errno = ENOENT;
    return -1;
  }
  if (strchr(file, '/')) return execve(file, argv, envp);
  if (!p) p = "/bin:/usr/bin";
  while (1) {
    const char *e = strchr(p, ':');
    size_t d = e ? (size_t)(e - p) : strlen(p);
    if (d + strlen(file) + 2 <= sizeof buf) {
      if (d) {
        memcpy(buf, p, d);
        buf[d] = '/';
        strcpy(buf + d + 1, file);
      } else {
        strcpy(buf, file);
      }
      execve(buf, argv, envp);
      if (errno == EACCES) saw_eacces = 1;
      else if (errno != ENOENT && errno != ENOTDIR)
        return -1;
    }
    if (!e) break;
    p = e + 1;
  }
  errno = saw_eacces ? EACCES : ENOENT;
  return -1;
}

int execvp(const char *file, char *const argv[]) {
  return execvpe(file, argv, environ);
}
