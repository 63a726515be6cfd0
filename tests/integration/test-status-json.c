/* SPDX-License-Identifier: MIT */
/* test-status-json.c: libshmref's status JSON writer (client-lib/status.c,
 * shmref_status_json) on a real daemon's status: the output is JSON a real parser
 * (Debian's python3) reads back to the same numbers and strings, including a client name
 * with quotes, a backslash and a control character (which the daemon drops: see proto/text.c). */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "proto.h"

static void hello_as(int fd, const char *name)
{
    uint8_t buf[256], rep[4096];
    struct proto_msg m = { .op = PROTO_OP_HELLO, .id = 1 };
    m.u.hello.version = PROTO_VERSION;
    m.u.hello.name = name;
    m.u.hello.name_len = (uint32_t)strlen(name);
    int n = proto_encode(&m, buf, sizeof(buf));
    cr_assert_gt(n, 0);
    cr_assert_gt(raw_roundtrip(fd, buf, (size_t)n, rep, sizeof(rep), 5000), 0);
}

Test(status_json, a_real_parser_reads_it_back, .timeout = 60)
{
    struct daemon d;
    char path[] = "/tmp/shmref-test-json-XXXXXX", cmd[512];
    daemon_start(&d, NULL);
    int raw = raw_connect(&d);
    hello_as(raw, "q\"uo\\te\x01");
    shmref_conn *c = connect_ok(&d);
    shmref_buf *b;
    cr_assert_eq(shmref_lease(c, 5000, &b), 0);
    shmref_status *st;
    cr_assert_eq(shmref_status_get(c, &st), 0, "%s", shmref_errmsg(c));
    const char *json = shmref_status_json(st);
    cr_assert_not_null(json);
    cr_assert_eq(shmref_status_json(st), json, "rendered twice");
    int fd = mkstemp(path);
    cr_assert_eq(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    snprintf(cmd, sizeof(cmd),
             "/usr/bin/python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); "
             "names=[x[\"name\"] for x in s[\"clients\"]]; "
             "assert \"q\\\"uo\\\\te\" in names, names; "
             "assert s[\"buffers\"][\"leases\"] == 1, s[\"buffers\"]; "
             "assert s[\"daemon\"][\"clients\"] == 2, s[\"daemon\"]; "
             "assert s[\"pool\"][\"bytes_leased\"] == 8192, s[\"pool\"]' %s", path);
    int r = system(cmd);
    unlink(path);
    cr_assert_eq(r, 0, "python3 did not read the JSON back as expected: %s", json);
    shmref_status_free(st);
    shmref_release(b);
    shmref_close(c);
    close(raw);
    daemon_stop(&d);
}
