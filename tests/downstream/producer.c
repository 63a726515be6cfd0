/* SPDX-License-Identifier: MIT */
/* producer.c: a downstream program built against the installed libshmref only (the
 * public header and the library, found through CMake's package or pkg-config). It leases
 * 1 MiB on the socket given as argv[1], writes a pattern, publishes it, acquires its own
 * descriptor on a second connection, checks every byte, and prints the descriptor.
 * Exit status: 0 done, 1 a call failed or a byte differed, 2 usage. */
#include <stdio.h>
#include <string.h>

#include <shmref/shmref.h>

#define SIZE (1u << 20)
#define META "u1[1048576]"

static unsigned char pattern(size_t i)
{
    return (unsigned char)((i * 131u + (i >> 12) + 7u) & 0xffu);
}

static int fail(const char *what, int r, const shmref_conn *conn)
{
    const char *msg = conn ? shmref_errmsg(conn) : "";
    fprintf(stderr, "producer: %s: %s%s%s\n", what, strerror(-r), *msg ? ": " : "", msg);
    return 1;
}

/* consume: acquire desc on conn and compare it with the pattern. */
static int consume(shmref_conn *conn, const shmref_desc *desc)
{
    shmref_buf *buf;
    size_t meta_len;
    int r = shmref_acquire(conn, desc, &buf);
    if (r < 0)
        return fail("acquire", r, conn);
    const unsigned char *p = shmref_buf_data(buf);
    const char *meta = shmref_buf_meta(buf, &meta_len);
    int bad = shmref_buf_writable(buf) || shmref_buf_size(buf) != SIZE || !p ||
              meta_len != strlen(META) || !meta || memcmp(meta, META, meta_len) != 0;
    for (size_t i = 0; !bad && i < SIZE; i++)
        bad = p[i] != pattern(i);
    if (bad)
        fprintf(stderr, "producer: the acquired buffer differs from what was written\n");
    if ((r = shmref_release(buf)) < 0)
        return fail("release", r, conn);
    return bad;
}

int main(int argc, char **argv)
{
    shmref_conn *producer = NULL, *consumer = NULL;
    shmref_buf *buf;
    shmref_desc desc, parsed;
    char text[SHMREF_DESC_TEXT_MAX];
    int r, code = 1;

    if (argc != 2) {
        fprintf(stderr, "usage: producer SOCKET\n");
        return 2;
    }
    if ((r = shmref_connect(argv[1], &producer)) < 0)
        return fail("connect", r, NULL);
    if ((r = shmref_lease(producer, SIZE, &buf)) < 0) {
        fail("lease", r, producer);
        goto out;
    }
    unsigned char *p = shmref_buf_data(buf);
    if (!shmref_buf_writable(buf) || shmref_buf_capacity(buf) < SIZE) {
        fprintf(stderr, "producer: the lease is not a writable 1 MiB buffer\n");
        goto out;
    }
    for (size_t i = 0; i < SIZE; i++)
        p[i] = pattern(i);
    if ((r = shmref_publish(buf, SIZE, 0, META, strlen(META), &desc)) < 0) {
        fail("publish", r, producer);
        goto out;
    }
    if ((r = shmref_desc_to_text(&desc, text, sizeof(text))) < 0 ||
        (r = shmref_desc_from_text(text, &parsed)) < 0 || memcmp(&parsed, &desc, sizeof(desc)) != 0) {
        fprintf(stderr, "producer: the descriptor does not survive its text form\n");
        goto out;
    }
    /* The producer still holds its lease, so the buffer is alive without retention. */
    if ((r = shmref_connect(argv[1], &consumer)) < 0) {
        fail("connect (second connection)", r, NULL);
        goto out;
    }
    if (consume(consumer, &parsed) != 0)
        goto out;
    if ((r = shmref_release(buf)) < 0) {
        fail("release", r, producer);
        goto out;
    }
    printf("%s\n", text);
    code = fflush(stdout) == 0 ? 0 : 1;
out:
    shmref_close(consumer);
    shmref_close(producer);
    return code;
}
