/* A small JSON reader for the request headers the host sends.
 *
 * It reads one value (objects, arrays, strings, numbers, true, false, null) into a
 * tree allocated from an arena that `json_free` releases at once. Strings are decoded
 * to UTF-8; a lone surrogate U+DC80..U+DCFF becomes the byte 0x80..0xFF, which is how
 * Python's `surrogateescape` carries bytes that are not UTF-8 (a command may hold such
 * bytes), so they reach the command unchanged. Nesting is limited (MAX_DEPTH).
 */
#include <stdlib.h>
#include <string.h>

#include "helper.h"

#define MAX_DEPTH 32

struct jarena {
    struct jarena *next;
    size_t used, size;
    char data[];
};

struct parser {
    const char *at, *end;
    struct jarena **arena;
    const char *error;
};

static void *arena_alloc(struct parser *p, size_t size) {
    size = (size + 15) & ~(size_t)15;
    struct jarena *block = *p->arena;
    if (block == NULL || block->size - block->used < size) {
        size_t capacity = size > 65536 ? size : 65536;
        struct jarena *fresh = malloc(sizeof(struct jarena) + capacity);
        if (fresh == NULL) {
            p->error = "out of memory";
            return NULL;
        }
        fresh->next = block;
        fresh->used = 0;
        fresh->size = capacity;
        *p->arena = fresh;
        block = fresh;
    }
    void *memory = block->data + block->used;
    block->used += size;
    memset(memory, 0, size);
    return memory;
}

void json_free(struct jarena *arena) {
    while (arena != NULL) {
        struct jarena *next = arena->next;
        free(arena);
        arena = next;
    }
}

static void skip_space(struct parser *p) {
    while (p->at < p->end && (*p->at == ' ' || *p->at == '\t' || *p->at == '\n' || *p->at == '\r'))
        p->at++;
}

static int hex4(struct parser *p, unsigned *value) {
    if (p->end - p->at < 4)
        return -1;
    *value = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->at[i];
        unsigned digit = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                         : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                         : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                                : 16;
        if (digit == 16)
            return -1;
        *value = *value * 16 + digit;
    }
    p->at += 4;
    return 0;
}

static char *put_utf8(char *out, unsigned code) {
    if (code >= 0xDC80 && code <= 0xDCFF) { /* surrogateescape: one raw byte */
        *out++ = (char)(code - 0xDC00);
    } else if (code < 0x80) {
        *out++ = (char)code;
    } else if (code < 0x800) {
        *out++ = (char)(0xC0 | (code >> 6));
        *out++ = (char)(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
        *out++ = (char)(0xE0 | (code >> 12));
        *out++ = (char)(0x80 | ((code >> 6) & 0x3F));
        *out++ = (char)(0x80 | (code & 0x3F));
    } else {
        *out++ = (char)(0xF0 | (code >> 18));
        *out++ = (char)(0x80 | ((code >> 12) & 0x3F));
        *out++ = (char)(0x80 | ((code >> 6) & 0x3F));
        *out++ = (char)(0x80 | (code & 0x3F));
    }
    return out;
}

static int escape(struct parser *p, char **out) {
    char c = *p->at++;
    const char *plain = strchr("\"\\/bfnrt", c);
    if (c != 'u') {
        if (plain == NULL || c == '\0') {
            p->error = "bad escape in string";
            return -1;
        }
        *(*out)++ = "\"\\/\b\f\n\r\t"[plain - "\"\\/bfnrt"];
        return 0;
    }
    unsigned code, low;
    if (hex4(p, &code) != 0) {
        p->error = "bad \\u escape";
        return -1;
    }
    if (code >= 0xD800 && code < 0xDC00 && p->end - p->at >= 6 && p->at[0] == '\\' && p->at[1] == 'u') {
        const char *mark = p->at;
        p->at += 2;
        if (hex4(p, &low) == 0 && low >= 0xDC00 && low < 0xE000)
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        else
            p->at = mark; /* a lone high surrogate: kept as is */
    }
    *out = put_utf8(*out, code);
    return 0;
}

static int parse_string(struct parser *p, struct jv *value) {
    const char *close = p->at + 1;
    while (close < p->end && *close != '"')
        close += *close == '\\' ? 2 : 1;
    if (close >= p->end) {
        p->error = "unterminated string";
        return -1;
    }
    /* decoded text is never longer than its source: \uXXXX (6 bytes) yields at most 4 */
    char *out = arena_alloc(p, (size_t)(close - p->at) + 1);
    if (out == NULL)
        return -1;
    value->type = J_STR;
    value->str = out;
    p->at++;
    while (p->at < close) {
        if (*p->at == '\\') {
            p->at++;
            if (escape(p, &out) != 0)
                return -1;
        } else {
            *out++ = *p->at++;
        }
    }
    p->at = close + 1;
    *out = '\0';
    value->len = (size_t)(out - value->str);
    return 0;
}

static int parse_value(struct parser *p, struct jv *value, int depth);

static int parse_members(struct parser *p, struct jv *value, int depth, char closer) {
    struct jv **tail = &value->child;
    p->at++;
    skip_space(p);
    if (p->at < p->end && *p->at == closer) {
        p->at++;
        return 0;
    }
    for (;;) {
        struct jv *item = arena_alloc(p, sizeof *item);
        if (item == NULL)
            return -1;
        skip_space(p);
        if (closer == '}') {
            struct jv key;
            if (p->at >= p->end || *p->at != '"' || parse_string(p, &key) != 0) {
                p->error = p->error ? p->error : "expected a key";
                return -1;
            }
            item->key = key.str;
            skip_space(p);
            if (p->at >= p->end || *p->at++ != ':') {
                p->error = "expected ':'";
                return -1;
            }
        }
        if (parse_value(p, item, depth + 1) != 0)
            return -1;
        *tail = item;
        tail = &item->next;
        skip_space(p);
        if (p->at < p->end && *p->at == ',') {
            p->at++;
            continue;
        }
        if (p->at < p->end && *p->at == closer) {
            p->at++;
            return 0;
        }
        p->error = "expected ',' or a closing bracket";
        return -1;
    }
}

static int parse_word(struct parser *p, struct jv *value) {
    static const struct { const char *word; enum jtype type; int boolean; } words[] = {
        {"true", J_BOOL, 1}, {"false", J_BOOL, 0}, {"null", J_NULL, 0}};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        size_t length = strlen(words[i].word);
        if ((size_t)(p->end - p->at) >= length && memcmp(p->at, words[i].word, length) == 0) {
            value->type = words[i].type;
            value->boolean = words[i].boolean;
            p->at += length;
            return 0;
        }
    }
    char digits[64];
    size_t n = 0;
    while (p->at + n < p->end && n < sizeof digits - 1 && strchr("+-0123456789.eE", p->at[n]) && p->at[n])
        n++;
    memcpy(digits, p->at, n);
    digits[n] = '\0';
    char *stop;
    value->num = strtod(digits, &stop);
    if (n == 0 || stop != digits + n) {
        p->error = "unexpected character";
        return -1;
    }
    value->type = J_NUM;
    p->at += n;
    return 0;
}

static int parse_value(struct parser *p, struct jv *value, int depth) {
    skip_space(p);
    if (depth > MAX_DEPTH) {
        p->error = "nested too deeply";
        return -1;
    }
    if (p->at >= p->end) {
        p->error = "unexpected end";
        return -1;
    }
    switch (*p->at) {
    case '{':
        value->type = J_OBJ;
        return parse_members(p, value, depth, '}');
    case '[':
        value->type = J_ARR;
        return parse_members(p, value, depth, ']');
    case '"':
        return parse_string(p, value);
    default:
        return parse_word(p, value);
    }
}

struct jv *json_parse(const char *text, size_t len, struct jarena **arena, const char **error) {
    struct parser p = {text, text + len, arena, NULL};
    struct jv *root = arena_alloc(&p, sizeof *root);
    if (root != NULL && parse_value(&p, root, 0) == 0) {
        skip_space(&p);
        if (p.at == p.end)
            return root;
        p.error = "trailing characters";
    }
    *error = p.error ? p.error : "invalid JSON";
    return NULL;
}

const struct jv *json_get(const struct jv *object, const char *key) {
    if (object == NULL || object->type != J_OBJ)
        return NULL;
    for (const struct jv *item = object->child; item != NULL; item = item->next)
        if (strcmp(item->key, key) == 0)
            return item;
    return NULL;
}

const char *json_text(const struct jv *value) {
    if (value == NULL || value->type != J_STR || strlen(value->str) != value->len)
        return NULL;
    return value->str;
}

double json_number(const struct jv *object, const char *key, double fallback) {
    const struct jv *value = json_get(object, key);
    return value != NULL && value->type == J_NUM ? value->num : fallback;
}
