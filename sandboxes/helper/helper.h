/* rollstream-exec: the exec helper that runs as PID 1 of every docker sandbox.
 *
 * Shared declarations of its parts: json.c (reading request headers), wire.c
 * (frames and growable buffers), keeper.c (output kept as head + tail),
 * run.c (running one command), tar.c (files in and out), main.c (the loop).
 * The protocol is described in main.c and in sandboxes/docker_channel.py.
 */
#ifndef ROLLSTREAM_HELPER_H
#define ROLLSTREAM_HELPER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define PROTOCOL_VERSION 1
#define MAX_HEADER_BYTES (64u << 20) /* a command may carry a large heredoc */

/* json.c: a small JSON reader for request headers (objects, arrays, strings, numbers). */
enum jtype { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
struct jv {
    enum jtype type;
    int boolean;
    double num;
    char *str; /* J_STR: decoded UTF-8, NUL-terminated; `len` bytes (may hold NULs) */
    size_t len;
    char *key; /* set on members of an object */
    struct jv *child;
    struct jv *next;
};
struct jarena;
struct jv *json_parse(const char *text, size_t len, struct jarena **arena, const char **error);
void json_free(struct jarena *arena);
const struct jv *json_get(const struct jv *object, const char *key);
const char *json_text(const struct jv *value); /* a string without NULs, else NULL */
double json_number(const struct jv *object, const char *key, double fallback);

/* wire.c: growable buffers, a buffered reader and frames. */
struct buf {
    char *data;
    size_t len, cap;
};
void buf_add(struct buf *b, const void *data, size_t len);
void buf_text(struct buf *b, const char *text);
void buf_format(struct buf *b, const char *format, ...) __attribute__((format(printf, 2, 3)));
void buf_json_string(struct buf *b, const char *text, size_t len);
void buf_free(struct buf *b);

struct reader {
    int fd;
    size_t pos, len;
    char data[1 << 16];
};
int read_exact(struct reader *r, void *dest, size_t size); /* 0, or -1 at EOF or error */
int skip_exact(struct reader *r, size_t size);
int send_frame(int fd, const struct buf *header, const void *payload, size_t payload_len);
int reply_error(int fd, long long id, const char *message, int error_number);

/* keeper.c: the first and the last `part` bytes of one stream; everything counted. */
struct keeper {
    size_t part;
    char *head, *ring;
    size_t head_len, head_cap, ring_len, ring_pos;
    uint64_t total;
};
void keeper_init(struct keeper *k, size_t part);
void keeper_feed(struct keeper *k, const char *data, size_t len);
void keeper_tail(const struct keeper *k, struct buf *out);
void keeper_free(struct keeper *k);

/* run.c: one command, its output and how it ended. */
struct exec_request {
    char **argv;
    char **envp;
    const char *cwd;
    double timeout_s;
    double drain_s;
    size_t output_limit;
};
struct exec_outcome {
    int exit_code; /* the shell's convention: 128 + signal when killed by one */
    int signal;
    int timed_out;
    double duration_s;
    struct keeper out, err;
};
void run_command(const struct exec_request *request, int signal_fd, int channel, struct exec_outcome *outcome);
void reap_children(void);
void kill_everything_else(void);
double monotonic_s(void);

/* tar.c: extract an archive streamed from the host; pack a path into one. */
int tar_extract(struct reader *r, uint64_t size, const char *base, struct buf *error);
int tar_pack(const char *path, struct buf *out, struct buf *error);

#endif
