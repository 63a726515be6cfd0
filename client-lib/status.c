/* SPDX-License-Identifier: MIT */
/* status.c: the daemon's status snapshot, walked by dotted path or rendered as JSON.
 * The body is checked with proto_check() before msgpack-c unpacks it, like every
 * message, and keeps its own copy of the bytes (the objects point into them). */
#include "status.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <msgpack.h>

#include "requests.h"
#include "session.h"
#include "transport.h"

struct shmref_status {
    uint8_t *body;
    size_t body_len;
    msgpack_unpacked up;
    char *json;
    char **strs;      /* NUL-terminated copies handed out by shmref_status_str */
    unsigned nstrs;
};

static int status_from_reply(shmref_conn *conn, const struct proto_msg *rep, shmref_status **ret_status)
{
    const char *why;
    const uint8_t *body = rep->u.status_reply.body;
    size_t len = rep->u.status_reply.body_len;
    if (len == 0 || proto_check(body, len, PROTO_MAX_DEPTH, &why) < 0)
        return client_fail(conn, -EPROTO, "bad status from shmrefd");
    shmref_status *st = calloc(1, sizeof(*st));
    if (!st || !(st->body = malloc(len))) {
        free(st);
        return client_fail(conn, -ENOMEM, "out of memory");
    }
    memcpy(st->body, body, len);
    st->body_len = len;
    size_t off = 0;
    msgpack_unpacked_init(&st->up);
    if (msgpack_unpack_next(&st->up, (const char *)st->body, len, &off) != MSGPACK_UNPACK_SUCCESS ||
        st->up.data.type != MSGPACK_OBJECT_MAP) {
        shmref_status_free(st);
        return client_fail(conn, -EPROTO, "bad status from shmrefd");
    }
    *ret_status = st;
    return 0;
}

static int status_take(shmref_conn *conn, struct pending *p, const struct proto_msg *rep, int *fds, unsigned nfds,
                       bool lost)
{
    (void)lost;
    for (unsigned i = 0; i < nfds; i++)
        close(fds[i]);
    return status_from_reply(conn, rep, &p->status);
}

/* A status record's reply is freed with it (also one never collected, at teardown). */
static void status_dispose(struct pending *p)
{
    shmref_status_free(p->status);
    p->status = NULL;
}

const struct pending_ops status_ops = { .send = pending_send_plain, .take = status_take, .dispose = status_dispose };

int shmref_status_get(shmref_conn *conn, shmref_status **ret_status)
{
    if (!conn || !ret_status)
        return -EINVAL;
    int r = client_enter(conn);
    if (r < 0)
        return r;
    struct pending *p = pending_new(conn, PROTO_OP_STATUS, PENDING_WAIT, &status_ops);
    if (!p)
        return pending_new_error(conn);
    struct proto_msg req = { .op = PROTO_OP_STATUS };
    if ((r = pending_submit_msg(conn, p, &req)) == 0 && (r = pending_wait(conn, p, pending_budget(conn, 0))) == 0) {
        *ret_status = p->status;
        p->status = NULL;
    }
    pending_free(conn, p);
    return r;
}

void shmref_status_free(shmref_status *st)
{
    if (!st)
        return;
    msgpack_unpacked_destroy(&st->up);
    for (unsigned i = 0; i < st->nstrs; i++)
        free(st->strs[i]);
    free(st->strs);
    free(st->json);
    free(st->body);
    free(st);
}

/* walk: the object at a dotted path ("pool.classes.0.size"), or NULL. */
static const msgpack_object *walk(const shmref_status *st, const char *path)
{
    const msgpack_object *o = &st->up.data;
    const char *p = path;
    while (o && *p) {
        size_t n = strcspn(p, ".");
        if (o->type == MSGPACK_OBJECT_MAP) {
            const msgpack_object *next = NULL;
            for (uint32_t i = 0; i < o->via.map.size; i++) {
                const msgpack_object *k = &o->via.map.ptr[i].key;
                if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == n &&
                    memcmp(k->via.str.ptr, p, n) == 0) {
                    next = &o->via.map.ptr[i].val;
                    break;
                }
            }
            o = next;
        } else if (o->type == MSGPACK_OBJECT_ARRAY) {
            char *end;
            unsigned long idx = strtoul(p, &end, 10);
            if (n == 0 || end != p + n || idx >= o->via.array.size)
                return NULL;
            o = &o->via.array.ptr[idx];
        } else {
            return NULL;
        }
        p += n;
        if (*p == '.')
            p++;
    }
    return o;
}

int shmref_status_u64(const shmref_status *st, const char *path, uint64_t *ret)
{
    if (!st || !path || !ret)
        return -EINVAL;
    const msgpack_object *o = walk(st, path);
    if (!o)
        return -ENOENT;
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return -EINVAL;
    *ret = o->via.u64;
    return 0;
}

int shmref_status_str(const shmref_status *st, const char *path, const char **ret)
{
    if (!st || !path || !ret)
        return -EINVAL;
    const msgpack_object *o = walk(st, path);
    if (!o)
        return -ENOENT;
    if (o->type != MSGPACK_OBJECT_STR)
        return -EINVAL;
    char **v = realloc(st->strs, (st->nstrs + 1) * sizeof(*v));
    if (!v)
        return -ENOMEM;
    ((shmref_status *)st)->strs = v;
    char *s = strndup(o->via.str.ptr, o->via.str.size);
    if (!s)
        return -ENOMEM;
    v[((shmref_status *)st)->nstrs++] = s;
    *ret = s;
    return 0;
}

int shmref_status_count(const shmref_status *st, const char *path)
{
    if (!st || !path)
        return -EINVAL;
    const msgpack_object *o = walk(st, path);
    if (!o)
        return -ENOENT;
    if (o->type == MSGPACK_OBJECT_ARRAY)
        return (int)o->via.array.size;
    if (o->type == MSGPACK_OBJECT_MAP)
        return (int)o->via.map.size;
    return -EINVAL;
}

static void json_str(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static void json_obj(FILE *f, const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: fputs("null", f); break;
    case MSGPACK_OBJECT_BOOLEAN: fputs(o->via.boolean ? "true" : "false", f); break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: fprintf(f, "%llu", (unsigned long long)o->via.u64); break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: fprintf(f, "%lld", (long long)o->via.i64); break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: fprintf(f, "%.17g", o->via.f64); break;
    case MSGPACK_OBJECT_STR: json_str(f, o->via.str.ptr, o->via.str.size); break;
    case MSGPACK_OBJECT_ARRAY:
        fputc('[', f);
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            if (i)
                fputc(',', f);
            json_obj(f, &o->via.array.ptr[i]);
        }
        fputc(']', f);
        break;
    case MSGPACK_OBJECT_MAP:
        fputc('{', f);
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            if (i)
                fputc(',', f);
            if (k->type == MSGPACK_OBJECT_STR)
                json_str(f, k->via.str.ptr, k->via.str.size);
            else
                fputs("\"?\"", f);
            fputc(':', f);
            json_obj(f, &o->via.map.ptr[i].val);
        }
        fputc('}', f);
        break;
    default: fputs("null", f); break; /* bin and ext: never in a status */
    }
}

const char *shmref_status_json(shmref_status *st)
{
    if (!st)
        return NULL;
    if (st->json)
        return st->json;
    size_t len = 0;
    char *out = NULL;
    FILE *f = open_memstream(&out, &len);
    if (!f)
        return NULL;
    json_obj(f, &st->up.data);
    if (fclose(f) != 0) {
        free(out);
        return NULL;
    }
    st->json = out;
    return out;
}
