/* Running one command: spawn, read its output, time it out, reap it.
 *
 * The command is spawned (posix_spawn: a vfork, no copy of this process) in a process
 * group of its own, with stdin from /dev/null and stdout/stderr on two pipes, and its
 * output is read as it comes (keeper.c). It ends in one of three ways:
 * - it exits (or a signal kills it): output is read until both pipes close, or for
 *   `drain_s` more, since background children may hold them open (they keep running,
 *   as with `docker exec`);
 * - its wall-clock `timeout_s` passes: every process in the container but this one is
 *   killed (`kill(-1, SIGKILL)` from PID 1 spares only PID 1), `setsid` children too,
 *   until none is left, so nothing it started runs on into the next command;
 * - the host hangs up: this process exits, and the kernel kills the rest with PID 1.
 * As PID 1 this process also reaps every orphan (`reap_children`).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "helper.h"

#define READ_CHUNK 65536
#define KILL_ROUNDS 500 /* 10 ms apart: 5 s for a fork bomb to run out of processes */

static pid_t watched = -1;
static int watched_status;
static int watched_done;

double monotonic_s(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec / 1e9;
}

void reap_children(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        if (pid == watched) {
            watched_status = status;
            watched_done = 1;
        }
    }
}

static int others_alive(void) {
    DIR *proc = opendir("/proc");
    if (proc == NULL)
        return 0;
    int alive = 0;
    pid_t self = getpid();
    struct dirent *entry;
    while (!alive && (entry = readdir(proc)) != NULL) {
        char *end;
        long pid = strtol(entry->d_name, &end, 10);
        if (*end != '\0' || pid <= 0 || pid == self)
            continue;
        char path[64], line[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        FILE *stat_file = fopen(path, "re");
        if (stat_file == NULL)
            continue;
        size_t got = fread(line, 1, sizeof line - 1, stat_file);
        fclose(stat_file);
        line[got] = '\0';
        char *close = strrchr(line, ')');
        alive = close != NULL && close[1] == ' ' && close[2] != 'Z' && close[2] != 'X';
    }
    closedir(proc);
    return alive;
}

void kill_everything_else(void) {
    for (int round = 0; round < KILL_ROUNDS; round++) {
        kill(-1, SIGKILL);
        reap_children();
        if (!others_alive())
            return;
        struct timespec pause = {0, 10 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    fputs("rollstream-exec: processes survived SIGKILL for 5 s\n", stderr);
}

static void spawn_failed(struct exec_outcome *outcome, int code, const char *what, const char *detail) {
    char message[1024];
    int length = snprintf(message, sizeof message, "rollstream-exec: cannot %s: %s\n", what, detail);
    keeper_feed(&outcome->err, message, (size_t)length < sizeof message ? (size_t)length : sizeof message - 1);
    outcome->exit_code = code;
}

static pid_t spawn(const struct exec_request *request, int out_w, int err_w, struct exec_outcome *outcome) {
    struct stat info;
    const char *bad_cwd = stat(request->cwd, &info) != 0 ? strerror(errno)
                          : !S_ISDIR(info.st_mode)       ? "not a directory"
                                                         : NULL;
    if (bad_cwd != NULL) {
        char what[300];
        snprintf(what, sizeof what, "change to %s", request->cwd);
        spawn_failed(outcome, 126, what, bad_cwd);
        return -1;
    }
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attributes;
    sigset_t none;
    sigemptyset(&none);
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out_w, 1);
    posix_spawn_file_actions_adddup2(&actions, err_w, 2);
    posix_spawn_file_actions_addchdir_np(&actions, request->cwd);
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK);
    posix_spawnattr_setpgroup(&attributes, 0);
    posix_spawnattr_setsigmask(&attributes, &none);
    pid_t pid;
    int failed = posix_spawnp(&pid, request->argv[0], &actions, &attributes, request->argv, request->envp);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    if (failed) {
        char what[300];
        snprintf(what, sizeof what, "run %s", request->argv[0]);
        spawn_failed(outcome, failed == ENOENT ? 127 : 126, what, strerror(failed));
        return -1;
    }
    return pid;
}

struct streams {
    int fds[2];
    struct keeper *keepers[2];
};

/* Read what is ready; a stream that closed is marked -1. */
static void read_ready(struct streams *s, struct pollfd *polled) {
    static char chunk[READ_CHUNK];
    for (int i = 0; i < 2; i++) {
        if (s->fds[i] < 0 || !(polled[i].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        ssize_t got = read(s->fds[i], chunk, sizeof chunk);
        if (got > 0) {
            keeper_feed(s->keepers[i], chunk, (size_t)got);
        } else if (got == 0 || errno != EINTR) {
            close(s->fds[i]);
            s->fds[i] = -1;
        }
    }
}

static void finish(struct exec_outcome *outcome, struct streams *s, double started) {
    for (int i = 0; i < 2; i++)
        if (s->fds[i] >= 0)
            close(s->fds[i]);
    if (WIFSIGNALED(watched_status)) {
        outcome->signal = WTERMSIG(watched_status);
        outcome->exit_code = 128 + outcome->signal;
    } else {
        outcome->exit_code = WEXITSTATUS(watched_status);
    }
    outcome->duration_s = monotonic_s() - started;
    watched = -1;
}

static int wait_ms(double until, double now) {
    double left = (until - now) * 1000.0 + 1.0;
    return left <= 0 ? 0 : left > 1e9 ? 1000000000 : (int)left;
}

void run_command(const struct exec_request *request, int signal_fd, int channel, struct exec_outcome *outcome) {
    double started = monotonic_s();
    size_t part = request->output_limit / 4;
    keeper_init(&outcome->out, part);
    keeper_init(&outcome->err, part);
    int out_pipe[2], err_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
        spawn_failed(outcome, 126, "make pipes", strerror(errno));
        return;
    }
    watched_done = 0;
    watched = spawn(request, out_pipe[1], err_pipe[1], outcome);
    close(out_pipe[1]);
    close(err_pipe[1]);
    struct streams s = {{out_pipe[0], err_pipe[0]}, {&outcome->out, &outcome->err}};
    if (watched < 0) {
        close(out_pipe[0]);
        close(err_pipe[0]);
        outcome->duration_s = monotonic_s() - started;
        return;
    }
    double deadline = started + request->timeout_s, drain_until = 0;
    for (;;) {
        double now = monotonic_s();
        if (watched_done && ((s.fds[0] < 0 && s.fds[1] < 0) || now >= drain_until))
            break;
        if (!watched_done && !outcome->timed_out && now >= deadline) {
            outcome->timed_out = 1;
            kill_everything_else(); /* reaps the command too; what it wrote is still read */
        }
        struct pollfd polled[4] = {{s.fds[0], POLLIN, 0}, {s.fds[1], POLLIN, 0},
                                   {signal_fd, POLLIN, 0}, {channel, POLLRDHUP, 0}};
        double until = watched_done ? drain_until : outcome->timed_out ? now + 0.05 : deadline;
        if (poll(polled, 4, wait_ms(until, now)) < 0 && errno != EINTR)
            break;
        if (polled[3].revents & (POLLRDHUP | POLLHUP | POLLERR))
            _exit(0); /* the host is gone; as PID 1 this takes the container down with it */
        if (polled[2].revents & POLLIN) {
            struct signalfd_siginfo info;
            while (read(signal_fd, &info, sizeof info) == sizeof info) {
            }
            reap_children();
        }
        if (watched_done && drain_until == 0)
            drain_until = monotonic_s() + request->drain_s;
        read_ready(&s, polled);
    }
    finish(outcome, &s, started);
}
