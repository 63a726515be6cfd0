/* SPDX-License-Identifier: MIT */
/* descriptor.c: the public descriptor forms, over proto/desc.c. */
#include "transport.h"

#include <ctype.h>
#include <errno.h>
#include <string.h>

#include "desc.h"

_Static_assert(SHMREF_TOKEN_LEN == PROTO_TOKEN_LEN, "token length");
_Static_assert(SHMREF_DESC_TEXT_MAX >= DESC_TEXT_MAX, "text form length");
_Static_assert(SHMREF_DESC_BINARY_MAX == DESC_BINARY_MAX, "binary form length");
_Static_assert(SHMREF_META_MAX == PROTO_MAX_META, "metadata limit");

static struct desc to_desc(const shmref_desc *d)
{
    struct desc x;
    memcpy(x.token, d->token, sizeof(x.token));
    x.size = d->size;
    return x;
}

static void from_desc(const struct desc *x, shmref_desc *d)
{
    memcpy(d->token, x->token, sizeof(d->token));
    d->size = x->size;
}

int shmref_desc_to_text(const shmref_desc *desc, char *buf, size_t cap)
{
    if (!desc || !buf)
        return -EINVAL;
    struct desc x = to_desc(desc);
    return desc_to_text(&x, buf, cap);
}

int shmref_desc_from_text(const char *text, shmref_desc *ret_desc)
{
    if (!text || !ret_desc)
        return -EINVAL;
    while (isspace((unsigned char)*text))
        text++;
    size_t len = strlen(text);
    while (len && isspace((unsigned char)text[len - 1]))
        len--;
    struct desc x;
    int r = desc_from_text(text, len, &x);
    if (r < 0)
        return r;
    from_desc(&x, ret_desc);
    return 0;
}

int shmref_desc_to_binary(const shmref_desc *desc, void *buf, size_t cap)
{
    if (!desc || !buf)
        return -EINVAL;
    struct desc x = to_desc(desc);
    return desc_pack(&x, buf, cap);
}

int shmref_desc_from_binary(const void *buf, size_t len, shmref_desc *ret_desc)
{
    if (!buf || !ret_desc)
        return -EINVAL;
    struct desc x;
    int r = desc_unpack(buf, len, &x);
    if (r < 0)
        return r;
    from_desc(&x, ret_desc);
    return 0;
}
