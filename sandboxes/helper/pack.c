/* Packing one path of the sandbox into a tar archive for the host (see tar.c). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helper.h"

#define BLOCK 512
#define NAME_FIELD 100
#define MAX_SIZE_FIELD 077777777777ull /* what 11 octal digits hold: 8 GiB */
#define MAX_ARCHIVE 0xFFFFFFF0ull      /* a frame's payload length is a uint32 */

/* `value` in octal, zero-padded to fill `width` - 1 digits and a NUL (callers keep it in range). */
static void octal(char *field, size_t width, uint64_t value) {
    char digits[24];
    int length = snprintf(digits, sizeof digits, "%0*llo", (int)width - 1, (unsigned long long)value);
    memcpy(field, digits + length - ((int)width - 1), width - 1);
}

static void header_block(struct buf *out, const char *name, char type, const struct stat *info, uint64_t size,
                         const char *link) {
    char block[BLOCK] = {0};
    strncpy(block, name, NAME_FIELD); /* cut names come whole in a pax header before this one */
    octal(block + 100, 8, info->st_mode & 07777);
    octal(block + 108, 8, info->st_uid & 07777777);
    octal(block + 116, 8, info->st_gid & 07777777);
    octal(block + 124, 12, size);
    octal(block + 136, 12, info->st_mtime > 0 ? (uint64_t)info->st_mtime : 0);
    block[156] = type;
    if (link != NULL)
        strncpy(block + 157, link, NAME_FIELD);
    memcpy(block + 257, "ustar\0" "00", 8);
    memset(block + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < BLOCK; i++)
        sum += (unsigned char)block[i];
    snprintf(block + 148, 8, "%06o", sum);
    buf_add(out, block, BLOCK);
}

static void pad(struct buf *out) {
    static const char zeros[BLOCK];
    buf_add(out, zeros, (BLOCK - out->len % BLOCK) % BLOCK);
}

/* One pax record, "LENGTH KEY=VALUE\n", whose LENGTH counts its own digits. */
static void pax_record(struct buf *records, const char *key, const char *value) {
    size_t body = strlen(key) + strlen(value) + 3; /* ' ', '=', '\n' */
    size_t length = body + 1;
    while (length != body + (size_t)snprintf(NULL, 0, "%zu", length))
        length = body + (size_t)snprintf(NULL, 0, "%zu", length);
    buf_format(records, "%zu %s=%s\n", length, key, value);
}

static void entry_header(struct buf *out, const char *name, char type, const struct stat *info, uint64_t size,
                         const char *link) {
    if (strlen(name) > NAME_FIELD || (link != NULL && strlen(link) > NAME_FIELD)) {
        struct buf records = {0};
        if (strlen(name) > NAME_FIELD)
            pax_record(&records, "path", name);
        if (link != NULL && strlen(link) > NAME_FIELD)
            pax_record(&records, "linkpath", link);
        header_block(out, "././@PaxHeader", 'x', info, records.len, NULL);
        buf_add(out, records.data, records.len);
        pad(out);
        buf_free(&records);
    }
    header_block(out, name, type, info, size, link);
}

static int add_file(struct buf *out, const char *path, const char *name, const struct stat *info) {
    if ((uint64_t)info->st_size > MAX_SIZE_FIELD)
        return EFBIG;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno;
    entry_header(out, name, '0', info, (uint64_t)info->st_size, NULL);
    uint64_t left = (uint64_t)info->st_size;
    char chunk[65536];
    while (left > 0) {
        ssize_t got = read(fd, chunk, left < sizeof chunk ? (size_t)left : sizeof chunk);
        if (got <= 0)
            break; /* it shrank while read: the header's size is kept, zeros fill */
        buf_add(out, chunk, (size_t)got);
        left -= (uint64_t)got;
    }
    close(fd);
    while (left-- > 0)
        buf_add(out, "", 1);
    pad(out);
    return 0;
}

static int add_path(struct buf *out, const char *path, const char *name, struct buf *error);

static int add_children(struct buf *out, const char *path, const char *name, struct buf *error) {
    DIR *dir = opendir(path);
    if (dir == NULL)
        return errno;
    int failed = 0;
    struct dirent *entry;
    while (!failed && (entry = readdir(dir)) != NULL) {
        if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0)
            continue;
        struct buf child_path = {0}, child_name = {0};
        buf_format(&child_path, "%s/%s", path, entry->d_name);
        buf_format(&child_name, "%s/%s", name, entry->d_name);
        failed = add_path(out, child_path.data, child_name.data, error);
        buf_free(&child_path);
        buf_free(&child_name);
    }
    closedir(dir);
    return failed;
}

static int add_path(struct buf *out, const char *path, const char *name, struct buf *error) {
    struct stat info;
    int failed = 0;
    if (out->len > MAX_ARCHIVE)
        failed = EFBIG;
    else if (lstat(path, &info) != 0)
        failed = errno;
    else if (S_ISREG(info.st_mode))
        failed = add_file(out, path, name, &info);
    else if (S_ISLNK(info.st_mode)) {
        char target[4096];
        ssize_t length = readlink(path, target, sizeof target - 1);
        if (length < 0)
            return errno;
        target[length] = '\0';
        entry_header(out, name, '2', &info, 0, target);
    } else if (S_ISDIR(info.st_mode)) {
        struct buf dir_name = {0};
        buf_format(&dir_name, "%s/", name);
        entry_header(out, dir_name.data, '5', &info, 0, NULL);
        buf_free(&dir_name);
        failed = add_children(out, path, name, error);
    } /* sockets, fifos and devices are left out */
    if (failed && error->len == 0)
        buf_format(error, "%s: %s", path, strerror(failed));
    return failed;
}

int tar_pack(const char *path, struct buf *out, struct buf *error) {
    struct buf trimmed = {0};
    buf_text(&trimmed, path);
    while (trimmed.len > 1 && trimmed.data[trimmed.len - 1] == '/')
        trimmed.data[--trimmed.len] = '\0';
    const char *slash = strrchr(trimmed.data, '/');
    const char *name = slash != NULL && slash[1] ? slash + 1 : ".";
    int failed = add_path(out, trimmed.data, name, error);
    buf_free(&trimmed);
    if (!failed) {
        static const char end[2 * BLOCK];
        buf_add(out, end, sizeof end);
    } else if (failed == EFBIG) {
        buf_free(error);
        buf_format(error, "%s: larger than one transfer can carry (4 GiB)", path);
    }
    return failed;
}
