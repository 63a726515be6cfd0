/* SPDX-License-Identifier: MIT */
/* arrow-example.c: the C example of a unit of work in docs/arrow.md (compiled and run by
 * test-arrow.c, which checks docs/arrow.md shows this very code). */
#include <stdio.h>
#include <shmref/shmref.h>

/* Producer: one float64 column written in place, published with its manifest. */
int example_producer(const char *socket, char *text, size_t cap)
{
    enum { N = 1000 };
    shmref_conn *c;
    shmref_unit *u = NULL;
    shmref_desc d;
    uint64_t off;
    double *x;
    if (shmref_connect(socket, &c) < 0)
        return -1;
    if (shmref_unit_begin(c, N * sizeof(double), &u) < 0 ||
        shmref_unit_claim(u, N * sizeof(double), &off, (void **)&x) < 0)
        goto fail;
    for (int i = 0; i < N; i++)
        x[i] = i * 0.5;                                   /* write where the consumer reads */
    uint64_t offs[2] = { 0, off }, lens[2] = { 0, N * sizeof(double) }; /* no validity bitmap */
    if (shmref_unit_add_buffers(u, "x", "g", 0, N, 0, 2, offs, lens) < 0 ||
        shmref_unit_publish(u, 10000, &d) < 0)           /* kept 10 s for the consumer */
        goto fail;
    shmref_desc_to_text(&d, text, cap);                  /* hand it over: argv, HTTP, a queue */
    shmref_unit_release(u);
    shmref_close(c);
    return 0;
fail:
    fprintf(stderr, "producer: %s\n", shmref_errmsg(c));
    shmref_unit_release(u);
    shmref_close(c);
    return -1;
}

/* Consumer: the column as an Arrow C Data Interface array, zero-copy. */
double example_consumer(const char *socket, const char *text)
{
    shmref_conn *c;
    shmref_unit *u;
    shmref_desc d;
    struct ArrowSchema schema;
    struct ArrowArray array;
    if (shmref_desc_from_text(text, &d) < 0 || shmref_connect(socket, &c) < 0)
        return -1;
    if (shmref_unit_acquire(c, &d, &u) < 0) {            /* the manifest is checked here */
        fprintf(stderr, "consumer: %s\n", shmref_errmsg(c));
        shmref_close(c);
        return -1;
    }
    int col = shmref_unit_column_index(u, "x");
    int r = shmref_unit_export_array(u, 0, col, &schema, &array);
    shmref_unit_release(u);                              /* the array keeps the buffer */
    shmref_close(c);                                     /* even past the connection */
    if (r < 0)
        return -1;
    const double *x = (const double *)array.buffers[1] + array.offset;
    double sum = 0;
    for (int64_t i = 0; i < array.length; i++)
        sum += x[i];
    array.release(&array);                               /* last reference: back to shmrefd */
    schema.release(&schema);
    return sum;
}
