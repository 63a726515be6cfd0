/* SPDX-License-Identifier: MIT */
/* exports.c: release callbacks of exported Arrow structures, serialised with the
 * connection they were acquired on (see exports.h). A structure is moved (bitwise, as
 * the C Data Interface allows) into a block of ours before its release is run or queued,
 * so the consumer's memory is free to go at once. */
#include "exports.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- arrays ---- */

struct array_wrap {
    struct conn_core *core;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

static void run_array_release(void *arg)
{
    struct ArrowArray *a = arg;
    a->release(a);
    free(a);
}

static void wrapped_array_release(struct ArrowArray *a)
{
    struct array_wrap *w = a->private_data;
    struct conn_core *core = w->core;
    a->release = w->release;
    a->private_data = w->private_data;
    free(w);
    struct ArrowArray *moved = malloc(sizeof(*moved));
    if (!moved || (*moved = *a, conn_core_run(core, run_array_release, moved)) < 0) {
        free(moved);
        a->release(a); /* out of memory: no better choice left */
    }
    a->release = NULL;
    conn_core_unref(core);
}

int exports_wrap_array(struct conn_core *core, struct ArrowArray *a)
{
    if (!a || !a->release)
        return 0;
    for (int64_t i = 0; i < a->n_children; i++)
        if (exports_wrap_array(core, a->children[i]) < 0)
            return -ENOMEM;
    if (exports_wrap_array(core, a->dictionary) < 0)
        return -ENOMEM;
    struct array_wrap *w = malloc(sizeof(*w));
    if (!w)
        return -ENOMEM;
    w->core = conn_core_ref(core);
    w->release = a->release;
    w->private_data = a->private_data;
    a->private_data = w;
    a->release = wrapped_array_release;
    return 0;
}

/* ---- streams ---- */

struct stream_wrap {
    struct conn_core *core;
    struct ArrowArrayStream inner;
};

static int wrapped_get_schema(struct ArrowArrayStream *st, struct ArrowSchema *out)
{
    struct stream_wrap *w = st->private_data;
    return w->inner.get_schema(&w->inner, out);
}

static int wrapped_get_next(struct ArrowArrayStream *st, struct ArrowArray *out)
{
    struct stream_wrap *w = st->private_data;
    int r = w->inner.get_next(&w->inner, out);
    if (r == 0 && out->release && exports_wrap_array(w->core, out) < 0) {
        out->release(out);
        return ENOMEM;
    }
    return r;
}

static const char *wrapped_get_last_error(struct ArrowArrayStream *st)
{
    struct stream_wrap *w = st->private_data;
    return w->inner.get_last_error(&w->inner);
}

static void run_stream_release(void *arg)
{
    struct stream_wrap *w = arg;
    w->inner.release(&w->inner);
    free(w);
}

static void wrapped_stream_release(struct ArrowArrayStream *st)
{
    struct stream_wrap *w = st->private_data;
    struct conn_core *core = w->core;
    st->release = NULL;
    if (conn_core_run(core, run_stream_release, w) < 0)
        run_stream_release(w); /* out of memory: no better choice left */
    conn_core_unref(core);
}

int exports_wrap_stream(struct conn_core *core, struct ArrowArrayStream *st)
{
    struct stream_wrap *w = malloc(sizeof(*w));
    if (!w)
        return -ENOMEM;
    w->core = conn_core_ref(core);
    w->inner = *st; /* moved */
    *st = (struct ArrowArrayStream){ .get_schema = wrapped_get_schema, .get_next = wrapped_get_next,
                                     .get_last_error = wrapped_get_last_error,
                                     .release = wrapped_stream_release, .private_data = w };
    return 0;
}
