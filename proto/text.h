/* SPDX-License-Identifier: MIT */
/* text.h: making untrusted strings (a client's name in hello) safe to show: valid UTF-8,
 * no control or bidirectional-override characters, so a status table, a JSON document or
 * a log line cannot be broken or disguised by what a client calls itself. Pure code. */
#ifndef SHMREF_TEXT_H
#define SHMREF_TEXT_H

#include <stddef.h>

/* text_clean: copies src[0..len) to dst as NUL-terminated valid UTF-8: every byte that is
 * not part of a well-formed UTF-8 sequence (overlong forms, surrogates and code points
 * above U+10FFFF included) becomes '?'; C0 and C1 controls, DEL and the bidirectional
 * controls (U+061C, U+200E/F, U+202A-U+202E, U+2066-U+2069) are dropped. The result is
 * never longer than src, so dst needs len + 1 bytes. Returns the length written. */
size_t text_clean(char *dst, const char *src, size_t len);

#endif
