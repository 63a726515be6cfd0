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
    shmref_close(conn);
    return 0;
}
