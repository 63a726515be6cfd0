/* SPDX-License-Identifier: MIT */
/* uses-header.c: compiled as C99 and as C++ by ctest, to keep shmref.h self-contained
 * and usable from both languages. Only compiled, never linked. */
#include <shmref/shmref.h>

int uses_header(void);

int uses_header(void)
{
    shmref_conn *conn = 0;
    shmref_buf *buf = 0;
    shmref_desc desc;
    char text[SHMREF_DESC_TEXT_MAX];
    if (shmref_connect(0, &conn) < 0)
        return 1;
    if (shmref_lease(conn, 4096, &buf) < 0 || shmref_publish(buf, 4096, 0, 0, 0, &desc) < 0)
        return 1;
    shmref_desc_to_text(&desc, text, sizeof(text));
    shmref_release(buf);
    /* units of work and the Arrow ABI structs */
    shmref_unit *unit = 0;
    struct ArrowSchema schema;
    struct ArrowArray array;
    struct ArrowArrayStream stream;
    uint64_t off = 0;
    void *ptr = 0;
    if (shmref_unit_begin(conn, 4096, &unit) < 0 || shmref_unit_claim(unit, 64, &off, &ptr) < 0)
        return 1;
    shmref_unit_publish(unit, 0, &desc);
    shmref_unit_release(unit);
    if (shmref_unit_acquire(conn, &desc, &unit) < 0)
        return 1;
    if (shmref_unit_export_batch(unit, 0, &schema, &array) == 0) {
        array.release(&array);
        schema.release(&schema);
    }
    if (shmref_unit_export_stream(unit, &stream) == 0)
        stream.release(&stream);
    shmref_unit_release(unit);
    shmref_close(conn);
    return (int)(ARROW_FLAG_NULLABLE + ARROW_FLAG_DICTIONARY_ORDERED + ARROW_FLAG_MAP_KEYS_SORTED) - 7;
}
