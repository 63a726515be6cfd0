/* SPDX-License-Identifier: MIT */
/* unit.h: libshmref's private view of units of work. Not installed.
 * A producer unit owns a lease, a bump allocator over it and the manifest being built.
 * A consumer unit holds one reference on a holder: the acquired buffer (pinned, so it
 * outlives shmref_close), its checked manifest and an atomic count of references, one
 * per unit handle and one per exported Arrow structure (arrays, streams). */
#ifndef SHMREF_UNIT_H
#define SHMREF_UNIT_H

#include <stdatomic.h>

#include "conn.h"
#include "manifest.h"

struct unit_holder {
    atomic_uint refs;
    shmref_buf *buf;
    const uint8_t *base;
    size_t len;
    struct manifest *m;
};

struct unit_batch {
    struct manifest_array **cols;
    uint32_t n, cap;
};

struct shmref_unit {
    shmref_conn *conn;
    bool producer;
    /* producer */
    shmref_buf *buf;
    uint8_t *base;
    size_t size, used;
    bool published;
    bool sealed;                  /* published sealed (base is NULL from the publish on) */
    struct manifest *m;           /* arena for fields and arrays; columns set at publish */
    struct manifest_field **fields;
    uint32_t n_fields, cap_fields;
    struct unit_batch *batches;
    uint32_t n_batches, cap_batches;
    /* consumer */
    struct unit_holder *h;
};

void unit_holder_ref(struct unit_holder *h);
void unit_holder_unref(struct unit_holder *h);

/* unit_add_column: append a described column to the producer's current batch (checks
 * it against batch 0's field when this is a later batch). */
int unit_add_column(shmref_unit *u, struct manifest_field *f, struct manifest_array *a);

/* unit_add_field: a column with no batch at all (the schema of an empty stream). */
int unit_add_field(shmref_unit *u, struct manifest_field *f);

/* unit_manifest_of: the manifest of a producer or a consumer unit (NULL for a producer
 * before publish). */
const struct manifest *unit_manifest_of(const shmref_unit *u);

#endif
