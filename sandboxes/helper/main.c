/* rollstream-exec: the exec helper, PID 1 of every docker sandbox.
 *
 * Usage: rollstream-exec --connect SOCKET --token TOKEN
 *
 * It connects to SOCKET, a Unix socket the host listens on in a directory bind-mounted
 * read-only into this container only (the host accepts one connection, then removes the
 * socket, so no command can reach this helper or any other sandbox's), says hello, and
 * serves the host's requests one at a time until the host hangs up; then it exits, and
 * with PID 1 the kernel ends every process of the container.
 *
 * Frames (both ways): uint32 header length, uint32 payload length (big-endian), the
 * header (a JSON object), the payload (raw bytes). No interpreter is involved on either
 * side: the helper is a static binary, and the image needs neither Python nor coreutils.
 *   hello:   {"op":"ready","token":T,"version":1,"pid":P}
 *   exec:    {"id":N,"op":"exec","argv":[...],"env":{...},"cwd":D,"timeout_s":F,
 *             "drain_s":F,"output_limit":B}
 *         -> {"id":N,"exit_code":C,"signal":S,"timed_out":bool,"duration_s":F,
 *             "stdout":[HEAD,TAIL,TOTAL],"stderr":[HEAD,TAIL,TOTAL]}, payload: the kept
 *             bytes, stdout head and tail then stderr head and tail
 *   put:     {"id":N,"op":"put","path":D}, payload: a tar archive, extracted under D -> {"id":N}
 *   get:     {"id":N,"op":"get","path":P} -> {"id":N}, payload: a tar archive of P
 *   failure: {"id":N,"error":MESSAGE,"errno":E}
 *
 * Hardening: the helper is not dumpable (no ptrace, no /proc/1/fd for commands without
 * CAP_SYS_PTRACE), keeps no descriptor open across exec, and, as PID 1, receives no
 * signal from inside its PID namespace that it has no handler for (it installs none).
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "helper.h"

extern char **environ;

static int connect_to(const char *path) {
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof address.sun_path) {
        fprintf(stderr, "rollstream-exec: socket path too long: %s\n", path);
        exit(2);
    }
    strcpy(address.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
        fprintf(stderr, "rollstream-exec: cannot connect to %s: %s\n", path, strerror(errno));
        exit(2);
    }
    return fd;
}

/* The helper's environment (the container's) with the request's variables set over it. */
static char **command_env(const struct jv *env) {
    size_t count = 0, extra = 0;
    while (environ[count] != NULL)
        count++;
    for (const struct jv *item = env ? env->child : NULL; item != NULL; item = item->next)
        extra++;
    char **merged = calloc(count + extra + 1, sizeof *merged);
    size_t used = 0;
    for (size_t i = 0; merged != NULL && i < count; i++) {
        int replaced = 0;
        for (const struct jv *item = env ? env->child : NULL; item && !replaced; item = item->next) {
            size_t key_length = strlen(item->key);
            replaced = strncmp(environ[i], item->key, key_length) == 0 && environ[i][key_length] == '=';
        }
        if (!replaced)
            merged[used++] = strdup(environ[i]);
    }
    for (const struct jv *item = env ? env->child : NULL; merged && item; item = item->next) {
        const char *value = json_text(item);
        if (value == NULL || item->key[0] == '\0' || strchr(item->key, '=') != NULL)
            continue;
        struct buf pair = {0};
        buf_format(&pair, "%s=%s", item->key, value);
        merged[used++] = pair.data;
    }
    return merged;
}

static char **string_array(const struct jv *array) {
    if (array == NULL || array->type != J_ARR || array->child == NULL)
        return NULL;
    size_t count = 0;
    for (const struct jv *item = array->child; item != NULL; item = item->next, count++)
        if (json_text(item) == NULL)
            return NULL;
    char **strings = calloc(count + 1, sizeof *strings);
    size_t i = 0;
    for (const struct jv *item = array->child; strings != NULL && item != NULL; item = item->next)
        strings[i++] = item->str;
    return strings;
}

static void free_strings(char **strings) {
    for (size_t i = 0; strings != NULL && strings[i] != NULL; i++)
        free(strings[i]);
    free(strings);
}

static void stream_figures(struct buf *header, const char *name, const struct keeper *k, struct buf *payload) {
    size_t before = payload->len;
    if (k->head_len > 0)
        buf_add(payload, k->head, k->head_len);
    keeper_tail(k, payload);
    buf_format(header, ",\"%s\":[%zu,%zu,%llu]", name, k->head_len, payload->len - before - k->head_len,
               (unsigned long long)k->total);
}

static void serve_exec(int channel, int signal_fd, long long id, const struct jv *request) {
    struct exec_request command = {
        .argv = string_array(json_get(request, "argv")),
        .envp = command_env(json_get(request, "env")),
        .cwd = json_text(json_get(request, "cwd")),
        .timeout_s = json_number(request, "timeout_s", 180.0),
        .drain_s = json_number(request, "drain_s", 0.2),
        .output_limit = (size_t)json_number(request, "output_limit", 1000000.0),
    };
    if (command.argv == NULL || command.envp == NULL || command.cwd == NULL || command.timeout_s <= 0) {
        reply_error(channel, id, "exec needs argv (strings), env, cwd and a positive timeout_s", EINVAL);
    } else {
        struct exec_outcome outcome = {0};
        run_command(&command, signal_fd, channel, &outcome);
        struct buf header = {0}, payload = {0};
        buf_format(&header, "{\"id\":%lld,\"exit_code\":%d,\"signal\":%d,\"timed_out\":%s,\"duration_s\":%.6f", id,
                   outcome.exit_code, outcome.signal, outcome.timed_out ? "true" : "false", outcome.duration_s);
        stream_figures(&header, "stdout", &outcome.out, &payload);
        stream_figures(&header, "stderr", &outcome.err, &payload);
        buf_text(&header, "}");
        send_frame(channel, &header, payload.data, payload.len);
        buf_free(&header);
        buf_free(&payload);
        keeper_free(&outcome.out);
        keeper_free(&outcome.err);
    }
    free(command.argv); /* its strings belong to the request */
    free_strings(command.envp);
}

static void serve_files(int channel, struct reader *r, long long id, const char *op, const char *path,
                        uint32_t payload_len) {
    struct buf error = {0}, archive = {0}, header = {0};
    int error_number = 0;
    if (path == NULL) {
        skip_exact(r, payload_len);
        buf_text(&error, "put and get need a path");
        error_number = EINVAL;
    } else if (strcmp(op, "put") == 0) {
        error_number = tar_extract(r, payload_len, path, &error) == 0 ? 0 : EIO;
    } else {
        skip_exact(r, payload_len);
        error_number = tar_pack(path, &archive, &error);
    }
    if (error_number) {
        reply_error(channel, id, error.data ? error.data : "failed", error_number);
    } else {
        buf_format(&header, "{\"id\":%lld}", id);
        send_frame(channel, &header, archive.data, archive.len);
    }
    buf_free(&error);
    buf_free(&archive);
    buf_free(&header);
}

/* One request; -1 when the channel is closed or out of step (the helper then exits). */
static int serve(int channel, int signal_fd, struct reader *r) {
    unsigned char prefix[8];
    if (read_exact(r, prefix, sizeof prefix) != 0)
        return -1;
    uint32_t header_len = (uint32_t)prefix[0] << 24 | (uint32_t)prefix[1] << 16 | (uint32_t)prefix[2] << 8 | prefix[3];
    uint32_t payload_len = (uint32_t)prefix[4] << 24 | (uint32_t)prefix[5] << 16 | (uint32_t)prefix[6] << 8 | prefix[7];
    char *text = header_len <= MAX_HEADER_BYTES ? malloc(header_len + 1) : NULL;
    if (text == NULL || read_exact(r, text, header_len) != 0) {
        fprintf(stderr, "rollstream-exec: cannot read a %u-byte header\n", header_len);
        free(text);
        return -1;
    }
    struct jarena *arena = NULL;
    const char *problem = NULL;
    const struct jv *request = json_parse(text, header_len, &arena, &problem);
    long long id = (long long)json_number(request, "id", -1);
    const char *op = json_text(json_get(request, "op"));
    if (op != NULL && strcmp(op, "exec") == 0) {
        skip_exact(r, payload_len);
        serve_exec(channel, signal_fd, id, request);
    } else if (op != NULL && (strcmp(op, "put") == 0 || strcmp(op, "get") == 0)) {
        serve_files(channel, r, id, op, json_text(json_get(request, "path")), payload_len);
    } else {
        skip_exact(r, payload_len);
        reply_error(channel, id, request ? "unknown op" : problem, EINVAL);
    }
    json_free(arena);
    free(text);
    return 0;
}

static int parse_arguments(int argc, char **argv, const char **socket_path, const char **token) {
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--connect") == 0)
            *socket_path = argv[i + 1];
        else if (strcmp(argv[i], "--token") == 0)
            *token = argv[i + 1];
    }
    return *socket_path != NULL && *token != NULL ? 0 : -1;
}

int main(int argc, char **argv) {
    const char *socket_path = NULL, *token = NULL;
    if (parse_arguments(argc, argv, &socket_path, &token) != 0) {
        fputs("usage: rollstream-exec --connect SOCKET --token TOKEN\n", stderr);
        return 2;
    }
    if (getpid() != 1) { /* after a timeout it kills every process it may: only ever inside its own PID namespace */
        fputs("rollstream-exec: must run as PID 1 of its container (or of a PID namespace)\n", stderr);
        return 2;
    }
    prctl(PR_SET_DUMPABLE, 0);
    sigset_t children;
    sigemptyset(&children);
    sigaddset(&children, SIGCHLD);
    sigprocmask(SIG_BLOCK, &children, NULL);
    int signal_fd = signalfd(-1, &children, SFD_CLOEXEC | SFD_NONBLOCK);
    int channel = connect_to(socket_path);
    if (chdir("/") != 0 || signal_fd < 0)
        fprintf(stderr, "rollstream-exec: setup: %s\n", strerror(errno));
    struct buf hello = {0};
    buf_text(&hello, "{\"op\":\"ready\",\"token\":");
    buf_json_string(&hello, token, strlen(token));
    buf_format(&hello, ",\"version\":%d,\"pid\":%d}", PROTOCOL_VERSION, (int)getpid());
    if (send_frame(channel, &hello, NULL, 0) != 0)
        return 2;
    buf_free(&hello);
    struct reader *r = calloc(1, sizeof *r);
    r->fd = channel;
    for (;;) {
        struct pollfd polled[2] = {{channel, POLLIN, 0}, {signal_fd, POLLIN, 0}};
        if (r->pos == r->len && poll(polled, 2, -1) < 0 && errno != EINTR)
            return 3;
        if (polled[1].revents & POLLIN) {
            struct signalfd_siginfo info;
            while (read(signal_fd, &info, sizeof info) == sizeof info) {
            }
            reap_children();
        }
        if ((r->pos < r->len || (polled[0].revents & (POLLIN | POLLHUP | POLLERR))) &&
            serve(channel, signal_fd, r) != 0)
            return 0; /* the host hung up: exiting as PID 1 ends every process left */
    }
}
