/* dvtool: the harness's own program inside a trial container.
 *
 * Every process the harness starts in a trial container runs this binary, by an absolute
 * path on a read-only bind mount (validate/trial/tool.py builds it, static, from this file):
 * nothing the image's PATH, shell or dynamic linker resolves takes part in starting a phase,
 * so nothing an agent planted in the image (a shell earlier on PATH, /etc/ld.so.preload, a
 * replaced /bin/sh) runs on the harness's behalf.
 *
 *   dvtool init SECONDS [RUID EUID]
 *       PID 1 of a trial container. As root with RUID/EUID given, it drops to real ids RUID
 *       and effective (and saved) ids EUID, groups cleared: no process of the container can
 *       hold all three of its uids, so none can ptrace it or open /proc/1/mem without
 *       CAP_SYS_PTRACE, and the change of ids makes it non-dumpable (where the ids cannot be
 *       taken, as in a rootless user namespace, it keeps its own). Then it names itself
 *       "dvtool-ready" (the harness starts nothing before it reads that name), forks
 *       nothing, reaps every child reparented to it (no zombie holds the pids limit), and
 *       exits after SECONDS (a backstop: the harness kills the container long before).
 *
 *   dvtool run OUT ERR
 *       The verifier: /tests/test.sh run by the image's bash (/bin/bash, /usr/bin/bash) or,
 *       without one, its sh (/bin/sh, /usr/bin/sh), absolute paths only; standard output to
 *       OUT and standard error to ERR (created, no link followed), standard input empty. It
 *       is a child subreaper; once the script's process ends it kills every other process it
 *       may (kill(-1): nothing the script started outlives it) and exits with the script's
 *       status, or 121 when a signal ended the script (its last word is not its own), 127
 *       when the image has no shell.
 *
 *   dvtool rm PATH...
 *       Removes each PATH (a tree, never following a link); a missing PATH is not an error.
 *
 * Exit status 120 and a message on standard error for a usage or system error of its own.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define OWN_ERROR 120
#define TEST_SH "/tests/test.sh"
#define READY "dvtool-ready"
#define KILLED 121

static int fail(const char *what) {
    fprintf(stderr, "dvtool: %s: %s\n", what, strerror(errno));
    return OWN_ERROR;
}

static long number(const char *text) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || *end || v < 0) {
        fprintf(stderr, "dvtool: not a number: %s\n", text);
        exit(OWN_ERROR);
    }
    return v;
}

static void reap_all(void) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

static int init(int argc, char **argv) {
    if (argc != 3 && argc != 5) {
        fprintf(stderr, "usage: dvtool init SECONDS [RUID EUID]\n");
        return OWN_ERROR;
    }
    long seconds = number(argv[2]);
    if (argc == 5) {  /* a user namespace without these ids (rootless) refuses: PID 1 stays as it is */
        uid_t r = (uid_t)number(argv[3]), e = (uid_t)number(argv[4]);
        if (setgroups(0, NULL) == 0 && setresgid(r, e, e) == 0)
            setresuid(r, e, e);
    }
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    prctl(PR_SET_NAME, READY, 0, 0, 0);  /* the harness waits for this name: the ids are settled */
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    struct timespec end, now;
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += seconds;
    for (;;) {
        reap_all();
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > end.tv_sec || (now.tv_sec == end.tv_sec && now.tv_nsec >= end.tv_nsec))
            return 0;
        struct timespec wait = {end.tv_sec - now.tv_sec, end.tv_nsec - now.tv_nsec};
        if (wait.tv_nsec < 0) {
            wait.tv_sec -= 1;
            wait.tv_nsec += 1000000000L;
        }
        if (wait.tv_sec > 1) {
            wait.tv_sec = 1;
            wait.tv_nsec = 0;
        }
        sigtimedwait(&chld, NULL, &wait);
    }
}

static int open_out(const char *path) {
    return open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
}

static const char *shell(void) {
    static const char *const shells[] = {"/bin/bash", "/usr/bin/bash", "/bin/sh", "/usr/bin/sh"};
    for (size_t i = 0; i < sizeof shells / sizeof *shells; i++)
        if (access(shells[i], X_OK) == 0)
            return shells[i];
    return NULL;
}

static int run(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: dvtool run OUT ERR\n");
        return OWN_ERROR;
    }
    int out = open_out(argv[2]), err = open_out(argv[3]);
    int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (out < 0 || err < 0 || in < 0)
        return fail("opening the verifier's output files");
    if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0)
        return fail("dup2");
    const char *sh = shell();
    if (sh == NULL) {
        fprintf(stderr, "dvtool: the image has no shell at /bin/bash, /usr/bin/bash, /bin/sh or /usr/bin/sh\n");
        return 127;
    }
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    pid_t child = fork();
    if (child < 0)
        return fail("fork");
    if (child == 0) {
        char *const args[] = {(char *)sh, TEST_SH, NULL};
        execv(sh, args);
        fprintf(stderr, "dvtool: exec %s: %s\n", sh, strerror(errno));
        _exit(127);
    }
    for (;;) {
        int status;
        pid_t got = waitpid(-1, &status, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return fail("waitpid");
        if (got == child) {
            /* Nothing the script started outlives it: whatever is left (a process it forked,
             * one the agent's code forked for it) could otherwise write the reward after the
             * script's own last word. */
            kill(-1, SIGKILL);
            return WIFEXITED(status) ? WEXITSTATUS(status) : KILLED;
        }
    }
}

static int remove_at(int dir, const char *name) {
    if (unlinkat(dir, name, 0) == 0 || errno == ENOENT)
        return 0;
    if (errno != EISDIR && errno != EPERM)
        return -1;
    int fd = openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    DIR *d = fdopendir(fd);
    if (d == NULL) {
        close(fd);
        return -1;
    }
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (remove_at(dirfd(d), e->d_name) < 0)
            rc = -1;
    }
    closedir(d);
    if (rc == 0 && unlinkat(dir, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
        rc = -1;
    return rc;
}

static int rm(int argc, char **argv) {
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {  /* one descriptor per level of a deep tree */
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }
    int rc = 0;
    for (int i = 2; i < argc; i++) {
        if (argv[i][0] != '/') {
            fprintf(stderr, "dvtool: rm: not an absolute path: %s\n", argv[i]);
            rc = OWN_ERROR;
            continue;
        }
        if (remove_at(AT_FDCWD, argv[i]) < 0) {
            fprintf(stderr, "dvtool: rm %s: %s\n", argv[i], strerror(errno));
            rc = OWN_ERROR;
        }
    }
    return rc;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "init") == 0)
        return init(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "run") == 0)
        return run(argc, argv);
    if (argc >= 2 && strcmp(argv[1], "rm") == 0)
        return rm(argc, argv);
    fprintf(stderr, "usage: dvtool init SECONDS [RUID EUID] | run OUT ERR | rm PATH...\n");
    return OWN_ERROR;
}
