/* Files in and out of the sandbox as tar archives (POSIX ustar with pax extended headers).
 *
 * `tar_extract` reads an archive streamed from the host, entry by entry, without holding
 * it in memory, and writes it under `base`: directories, regular files (mode, mtime),
 * symlinks and hard links; names with `..` are refused; an existing file or symlink in
 * the way is replaced (never written through), as tar does. It always consumes exactly
 * `size` bytes, so a bad archive leaves the channel in step.
 *
 * `tar_pack` packs one path (file, symlink or directory tree, never following symlinks)
 * under its base name, with pax headers for names and link targets over 100 bytes.
 * Files are written as the helper's user, who is the container's user.
 */
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
#define MAX_META (1u << 20) /* pax records and GNU long names */

struct pending_dir {
    char *path;
    mode_t mode;
    time_t mtime;
};

struct extract {
    struct reader *r;
    uint64_t left;
    const char *base;
    char *long_name, *long_link;
    struct pending_dir *dirs;
    size_t dir_count;
    struct buf *error;
};

static int fail(struct buf *error, const char *what, const char *detail) {
    if (error->len == 0)
        buf_format(error, "%s: %s", what, detail);
    return -1;
}

static int take(struct extract *x, void *dest, uint64_t size) {
    if (size > x->left)
        return fail(x->error, "archive", "truncated");
    x->left -= size;
    return read_exact(x->r, dest, (size_t)size) == 0 ? 0 : fail(x->error, "archive", "channel closed");
}

/* A numeric header field: octal (leading spaces allowed), or base-256 for values octal cannot hold. */
static uint64_t number(const char *field, size_t width) {
    uint64_t value = 0;
    size_t i = 0;
    if ((unsigned char)field[0] & 0x80) {
        for (i = 1; i < width; i++)
            value = (value << 8) | (unsigned char)field[i];
        return value;
    }
    while (i < width && field[i] == ' ')
        i++;
    for (; i < width && field[i] >= '0' && field[i] <= '7'; i++)
        value = value * 8 + (uint64_t)(field[i] - '0');
    return value;
}

static int checksum_ok(const unsigned char *block) {
    uint64_t sum = 0;
    for (int i = 0; i < BLOCK; i++)
        sum += (i >= 148 && i < 156) ? ' ' : block[i];
    return sum == number((const char *)block + 148, 8);
}

/* `base` joined with `name` cleaned of `.` and empty parts; NULL when it climbs with `..`. */
static char *join_safe(const char *base, const char *name) {
    struct buf path = {0};
    buf_text(&path, base);
    while (path.len > 1 && path.data[path.len - 1] == '/')
        path.data[--path.len] = '\0';
    const char *part = name;
    while (*part) {
        const char *end = strchrnul(part, '/');
        size_t length = (size_t)(end - part);
        if (length == 2 && part[0] == '.' && part[1] == '.') {
            buf_free(&path);
            return NULL;
        }
        if (length > 0 && !(length == 1 && part[0] == '.')) {
            if (path.len == 0 || path.data[path.len - 1] != '/')
                buf_add(&path, "/", 1);
            buf_add(&path, part, length);
        }
        part = *end ? end + 1 : end;
    }
    return path.data;
}

static void make_parents(char *path) {
    for (char *slash = strchr(path + 1, '/'); slash != NULL; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        mkdir(path, 0755);
        *slash = '/';
    }
}

/* Remove what is in the way of a new entry at `path` (a directory stays for a directory). */
static void clear_way(const char *path, int keep_dir) {
    struct stat info;
    if (lstat(path, &info) != 0)
        return;
    if (S_ISDIR(info.st_mode)) {
        if (!keep_dir)
            rmdir(path);
        return;
    }
    unlink(path);
}

static int write_file(struct extract *x, const char *path, const char *header, uint64_t size) {
    mode_t mode = (mode_t)number(header + 100, 8) & 07777;
    clear_way(path, 0);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    char chunk[65536];
    int failed = fd < 0 ? fail(x->error, path, strerror(errno)) : 0;
    while (size > 0) {
        size_t n = size < sizeof chunk ? (size_t)size : sizeof chunk;
        if (take(x, chunk, n) != 0)
            break;
        if (!failed && write(fd, chunk, n) != (ssize_t)n)
            failed = fail(x->error, path, strerror(errno));
        size -= n;
    }
    if (fd >= 0) {
        struct timespec times[2] = {{0, UTIME_OMIT}, {(time_t)number(header + 136, 12), 0}};
        fchmod(fd, mode);
        futimens(fd, times);
        close(fd);
    }
    return size > 0 ? -1 : failed;
}

static void add_dir(struct extract *x, const char *path, const char *header) {
    clear_way(path, 1);
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        fail(x->error, path, strerror(errno));
    struct pending_dir *grown = realloc(x->dirs, (x->dir_count + 1) * sizeof *grown);
    if (grown == NULL)
        return;
    x->dirs = grown;
    x->dirs[x->dir_count++] = (struct pending_dir){
        strdup(path), (mode_t)number(header + 100, 8) & 07777, (time_t)number(header + 136, 12)};
}

/* Directory modes and times go last, deepest first: a read-only directory is still filled. */
static void finish_dirs(struct extract *x) {
    for (size_t i = x->dir_count; i-- > 0;) {
        struct timespec times[2] = {{0, UTIME_OMIT}, {x->dirs[i].mtime, 0}};
        chmod(x->dirs[i].path, x->dirs[i].mode);
        utimensat(AT_FDCWD, x->dirs[i].path, times, AT_SYMLINK_NOFOLLOW);
        free(x->dirs[i].path);
    }
    free(x->dirs);
}

static char *read_meta(struct extract *x, uint64_t size) {
    if (size > MAX_META) {
        fail(x->error, "archive", "extended header too large");
        return NULL;
    }
    char *text = malloc((size_t)size + 1);
    if (text == NULL || take(x, text, size) != 0) {
        free(text);
        return NULL;
    }
    text[size] = '\0';
    return text;
}

/* pax records: "LENGTH KEY=VALUE\n"; `path` and `linkpath` are the ones that matter here. */
static void apply_pax(struct extract *x, const char *records, size_t size) {
    const char *at = records, *end = records + size;
    while (at < end) {
        char *space;
        unsigned long length = strtoul(at, &space, 10);
        if (length == 0 || *space != ' ' || at + length > end)
            return;
        const char *key = space + 1, *equals = memchr(key, '=', (size_t)(at + length - key));
        if (equals != NULL) {
            char **slot = strncmp(key, "path=", 5) == 0       ? &x->long_name
                          : strncmp(key, "linkpath=", 9) == 0 ? &x->long_link
                                                               : NULL;
            if (slot != NULL) {
                free(*slot);
                *slot = strndup(equals + 1, (size_t)(at + length - 1 - (equals + 1)));
            }
        }
        at += length;
    }
}

static char *entry_name(struct extract *x, const char *header) {
    if (x->long_name != NULL) {
        char *name = x->long_name;
        x->long_name = NULL;
        return name;
    }
    struct buf name = {0};
    if (memcmp(header + 257, "ustar", 5) == 0 && header[345] != '\0') {
        buf_add(&name, header + 345, strnlen(header + 345, 155));
        buf_add(&name, "/", 1);
    }
    buf_add(&name, header, strnlen(header, 100));
    return name.data;
}

static char *link_name(struct extract *x, const char *header) {
    char *link = x->long_link ? x->long_link : strndup(header + 157, 100);
    x->long_link = NULL;
    return link;
}

static int extract_entry(struct extract *x, const char *header, uint64_t size) {
    char type = header[156];
    if (type == 'g')
        return take(x, NULL, size); /* global pax records: nothing here needs them */
    if (type == 'x' || type == 'L' || type == 'K') {
        char *meta = read_meta(x, size);
        if (meta == NULL)
            return -1;
        if (type == 'x')
            apply_pax(x, meta, (size_t)size);
        char **slot = type == 'L' ? &x->long_name : type == 'K' ? &x->long_link : NULL;
        if (slot != NULL) {
            free(*slot);
            *slot = meta;
        } else {
            free(meta);
        }
        return 0;
    }
    char *name = entry_name(x, header);
    char *path = join_safe(x->base, name);
    int result = 0;
    if (path == NULL) {
        result = fail(x->error, name, "a name that leaves the target directory");
    } else if (type == '5') {
        make_parents(path);
        add_dir(x, path, header);
    } else if (type == '0' || type == '\0' || type == '7') {
        make_parents(path);
        result = write_file(x, path, header, size);
        size = 0;
    } else if (type == '1' || type == '2') {
        char *linked = link_name(x, header);
        char *target = type == '1' ? join_safe(x->base, linked) : NULL;
        make_parents(path);
        clear_way(path, 0);
        if (type == '2' ? symlink(linked, path) : target ? link(target, path) : (errno = EINVAL, -1))
            result = fail(x->error, path, strerror(errno));
        free(target);
        free(linked);
    }
    free(name);
    free(path);
    return result == 0 && size > 0 ? take(x, NULL, size) : result;
}

int tar_extract(struct reader *r, uint64_t size, const char *base, struct buf *error) {
    struct extract x = {r, size, base, NULL, NULL, NULL, 0, error};
    mkdir(base, 0755);
    unsigned char header[BLOCK];
    int result = 0;
    while (result == 0 && x.left >= BLOCK) {
        if (take(&x, header, BLOCK) != 0)
            break;
        int zero = 1;
        for (int i = 0; zero && i < BLOCK; i++)
            zero = header[i] == 0;
        if (zero)
            break; /* the end-of-archive marker: the rest is padding */
        if (!checksum_ok(header)) {
            result = fail(error, "archive", "bad header checksum");
            break;
        }
        uint64_t entry_size = number((const char *)header + 124, 12);
        uint64_t padding = (BLOCK - entry_size % BLOCK) % BLOCK;
        result = extract_entry(&x, (const char *)header, entry_size);
        if (result == 0)
            result = take(&x, NULL, padding);
    }
    finish_dirs(&x);
    free(x.long_name);
    free(x.long_link);
    if (x.left > 0 && skip_exact(r, (size_t)x.left) != 0)
        return fail(error, "archive", "channel closed");
    return result == 0 && error->len == 0 ? 0 : -1;
}
