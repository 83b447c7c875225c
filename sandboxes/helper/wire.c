/* Frames on the channel, a buffered reader, and growable buffers for building replies.
 *
 * A frame is an 8-byte prefix (the header's length and the payload's length, each a
 * big-endian uint32), then the header (one JSON object, UTF-8), then the payload (raw
 * bytes: a command's output, a tar archive).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "helper.h"

static void buf_reserve(struct buf *b, size_t more) {
    if (b->cap - b->len > more)
        return;
    size_t capacity = b->cap ? b->cap : 256;
    while (capacity - b->len <= more)
        capacity *= 2;
    char *grown = realloc(b->data, capacity);
    if (grown == NULL) {
        static const char message[] = "rollstream-exec: out of memory\n";
        (void)!write(2, message, sizeof message - 1);
        _exit(70); /* the host sees the channel close: the sandbox is lost, as it should be */
    }
    b->data = grown;
    b->cap = capacity;
}

void buf_add(struct buf *b, const void *data, size_t len) {
    buf_reserve(b, len);
    memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
}

void buf_text(struct buf *b, const char *text) { buf_add(b, text, strlen(text)); }

void buf_format(struct buf *b, const char *format, ...) {
    char small[256];
    va_list args;
    va_start(args, format);
    int needed = vsnprintf(small, sizeof small, format, args);
    va_end(args);
    if (needed < 0)
        return;
    if ((size_t)needed < sizeof small) {
        buf_add(b, small, (size_t)needed);
        return;
    }
    buf_reserve(b, (size_t)needed + 1);
    va_start(args, format);
    vsnprintf(b->data + b->len, (size_t)needed + 1, format, args);
    va_end(args);
    b->len += (size_t)needed;
}

/* A JSON string; bytes that are not valid UTF-8 are replaced by U+FFFD (headers carry
 * only messages and paths; raw bytes travel in the payload). */
void buf_json_string(struct buf *b, const char *text, size_t len) {
    const unsigned char *s = (const unsigned char *)text;
    buf_add(b, "\"", 1);
    for (size_t i = 0; i < len;) {
        unsigned char c = s[i];
        size_t width = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int valid = width > 0 && i + width <= len;
        for (size_t k = 1; valid && k < width; k++)
            valid = (s[i + k] & 0xC0) == 0x80;
        if (!valid) {
            buf_text(b, "\\ufffd");
            i++;
        } else if (c == '"' || c == '\\') {
            buf_format(b, "\\%c", c);
            i++;
        } else if (c < 0x20) {
            buf_format(b, "\\u%04x", c);
            i++;
        } else {
            buf_add(b, s + i, width);
            i += width;
        }
    }
    buf_add(b, "\"", 1);
}

void buf_free(struct buf *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

int read_exact(struct reader *r, void *dest, size_t size) {
    char *out = dest;
    while (size > 0) {
        if (r->pos == r->len) {
            ssize_t got = read(r->fd, r->data, sizeof r->data);
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0)
                return -1;
            r->pos = 0;
            r->len = (size_t)got;
        }
        size_t take = r->len - r->pos < size ? r->len - r->pos : size;
        if (out != NULL) {
            memcpy(out, r->data + r->pos, take);
            out += take;
        }
        r->pos += take;
        size -= take;
    }
    return 0;
}

int skip_exact(struct reader *r, size_t size) { return read_exact(r, NULL, size); }

static int send_all(int fd, struct iovec *parts, int count) {
    while (count > 0) {
        struct msghdr message = {.msg_iov = parts, .msg_iovlen = (size_t)count};
        ssize_t sent = sendmsg(fd, &message, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR)
            continue;
        if (sent < 0)
            return -1;
        while (count > 0 && (size_t)sent >= parts->iov_len) {
            sent -= (ssize_t)parts->iov_len;
            parts++;
            count--;
        }
        if (count > 0) {
            parts->iov_base = (char *)parts->iov_base + sent;
            parts->iov_len -= (size_t)sent;
        }
    }
    return 0;
}

int send_frame(int fd, const struct buf *header, const void *payload, size_t payload_len) {
    unsigned char prefix[8];
    uint32_t lengths[2] = {(uint32_t)header->len, (uint32_t)payload_len};
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 4; k++)
            prefix[i * 4 + k] = (unsigned char)(lengths[i] >> (24 - 8 * k));
    struct iovec parts[3] = {
        {prefix, sizeof prefix}, {header->data, header->len}, {(void *)payload, payload_len}};
    return send_all(fd, parts, payload_len ? 3 : 2);
}

int reply_error(int fd, long long id, const char *message, int error_number) {
    struct buf header = {0};
    buf_format(&header, "{\"id\":%lld,\"error\":", id);
    buf_json_string(&header, message, strlen(message));
    if (error_number)
        buf_format(&header, ",\"errno\":%d", error_number);
    buf_text(&header, "}");
    int sent = send_frame(fd, &header, NULL, 0);
    buf_free(&header);
    return sent;
}
