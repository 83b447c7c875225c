/* A command's output stream kept within a bound: its first `part` bytes (the head) and
 * its last `part` bytes after those (the tail, in a ring); everything is counted. The
 * host puts the two together with the "bytes not kept" marker (sandboxes/output.py), so
 * the rule for what is kept is the same as for every other backend.
 */
#include <stdlib.h>
#include <string.h>

#include "helper.h"

void keeper_init(struct keeper *k, size_t part) {
    memset(k, 0, sizeof *k);
    k->part = part; /* the buffers come on first use: most commands print little */
}

static int grow_head(struct keeper *k, size_t need) {
    if (need <= k->head_cap)
        return 0;
    size_t capacity = k->head_cap ? k->head_cap : 4096;
    while (capacity < need)
        capacity *= 2;
    capacity = capacity < k->part ? capacity : k->part;
    char *grown = realloc(k->head, capacity);
    if (grown == NULL)
        return -1;
    k->head = grown;
    k->head_cap = capacity;
    return 0;
}

void keeper_feed(struct keeper *k, const char *data, size_t len) {
    k->total += len;
    size_t room = k->part - k->head_len;
    size_t take = len < room ? len : room;
    if (take > 0 && grow_head(k, k->head_len + take) != 0)
        take = 0; /* out of memory: counted, not kept */
    if (take > 0)
        memcpy(k->head + k->head_len, data, take);
    k->head_len += take;
    data += take;
    len -= take;
    if (len == 0 || k->part == 0)
        return;
    if (k->ring == NULL && (k->ring = malloc(k->part)) == NULL)
        return;
    if (len >= k->part) { /* the ring holds only the last `part` bytes of this chunk */
        memcpy(k->ring, data + len - k->part, k->part);
        k->ring_len = k->part;
        k->ring_pos = 0;
        return;
    }
    size_t first = k->part - k->ring_pos < len ? k->part - k->ring_pos : len;
    memcpy(k->ring + k->ring_pos, data, first);
    memcpy(k->ring, data + first, len - first);
    k->ring_pos = (k->ring_pos + len) % k->part;
    k->ring_len = k->ring_len + len > k->part ? k->part : k->ring_len + len;
}

/* The tail in order: the ring read from its oldest byte. */
void keeper_tail(const struct keeper *k, struct buf *out) {
    if (k->ring == NULL)
        return;
    if (k->ring_len < k->part) {
        buf_add(out, k->ring, k->ring_len);
        return;
    }
    buf_add(out, k->ring + k->ring_pos, k->part - k->ring_pos);
    buf_add(out, k->ring, k->ring_pos);
}

void keeper_free(struct keeper *k) {
    free(k->head);
    free(k->ring);
    k->head = k->ring = NULL;
}
