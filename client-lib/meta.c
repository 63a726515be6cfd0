/* SPDX-License-Identifier: MIT */
/* meta.c: the public face of the array metadata convention, over proto/meta.c. */
#include "transport.h"

#include <errno.h>
#include <string.h>

#include "meta.h"

_Static_assert(SHMREF_META_MAX_DIMS == META_MAX_DIMS, "dimensions");
_Static_assert(SHMREF_META_DTYPE_MAX == META_DTYPE_MAX, "type string length");
_Static_assert(SHMREF_META_USER_BIN == META_USER_BIN && SHMREF_META_USER_MSGPACK == META_USER_MSGPACK,
               "user kinds");

static void to_meta(const shmref_meta_array *a, struct meta_array *m)
{
    memcpy(m->dtype, a->dtype, sizeof(m->dtype));
    m->ndim = a->ndim;
    memcpy(m->shape, a->shape, sizeof(m->shape));
    m->order = a->order;
    m->offset = a->offset;
    m->user_kind = a->user_kind;
    m->user = a->user;
    m->user_len = a->user_len;
}

static void from_meta(const struct meta_array *m, shmref_meta_array *a)
{
    memcpy(a->dtype, m->dtype, sizeof(a->dtype));
    a->ndim = m->ndim;
    memcpy(a->shape, m->shape, sizeof(a->shape));
    a->order = m->order;
    a->offset = m->offset;
    a->user_kind = m->user_kind;
    a->user = m->user;
    a->user_len = m->user_len;
}

int shmref_meta_array_encode(const shmref_meta_array *m, void *buf, size_t cap, const char **ret_why)
{
    struct meta_array x;
    if (!m || (!buf && cap)) {
        if (ret_why)
            *ret_why = "m and buf must not be NULL";
        return -EINVAL;
    }
    to_meta(m, &x);
    x.dtype[META_DTYPE_MAX - 1] = '\0';
    return meta_array_encode(&x, buf, cap, ret_why);
}

int shmref_meta_array_decode(const void *buf, size_t len, shmref_meta_array *ret, const char **ret_why)
{
    struct meta_array x;
    if (!ret) {
        if (ret_why)
            *ret_why = "ret must not be NULL";
        return -EINVAL;
    }
    int r = meta_array_decode(buf, len, &x, ret_why);
    if (r == 0)
        from_meta(&x, ret);
    return r;
}

int shmref_meta_array_nbytes(const shmref_meta_array *m, uint64_t *ret)
{
    struct meta_array x;
    if (!m || !ret)
        return -EINVAL;
    to_meta(m, &x);
    x.dtype[META_DTYPE_MAX - 1] = '\0';
    return meta_array_nbytes(&x, ret);
}

int shmref_meta_array_itemsize(const char *dtype)
{
    return dtype ? meta_dtype_itemsize(dtype, strnlen(dtype, META_DTYPE_MAX)) : -EINVAL;
}

int shmref_buf_meta_array(const shmref_buf *buf, shmref_meta_array *ret)
{
    if (!buf || !ret)
        return -EINVAL;
    shmref_conn *conn = buf->conn;
    const char *why = "no metadata";
    struct meta_array x;
    uint64_t need;
    int r = buf->meta_len ? meta_array_decode(buf->meta, buf->meta_len, &x, &why) : -ENOMSG;
    if (r < 0)
        return client_fail(conn, r, "array metadata: %s", why);
    if (meta_array_nbytes(&x, &need) < 0 || need > buf->size)
        return client_fail(conn, -EBADMSG, "array metadata: the array (%llu bytes with its offset) "
                           "reaches past the %zu published bytes",
                           (unsigned long long)need, buf->size);
    from_meta(&x, ret);
    return 0;
}
