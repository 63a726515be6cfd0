/* SPDX-License-Identifier: MIT */
/* units.h: byte sizes for humans, shared by the daemon and the CLI. Pure code. */
#ifndef SHMREF_UNITS_H
#define SHMREF_UNITS_H

#include <stddef.h>
#include <stdint.h>

#define UNITS_TEXT_MAX 32

/* units_parse: "4096", "64K", "80M", "2G", "1T" (binary multiples; an optional trailing
 * "iB" or "B" is accepted). Returns 0, or -EINVAL (not a size) / -ERANGE (overflow). */
int units_parse(const char *text, uint64_t *ret);

/* units_format: "80.0 MiB", "512 B". Returns buf. */
const char *units_format(uint64_t bytes, char buf[UNITS_TEXT_MAX]);

#endif
