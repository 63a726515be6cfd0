/* SPDX-License-Identifier: MIT */
/* session.h: a libshmref connection's life: connect (the daemon's credentials checked,
 * the hello), the entry of every public call (a forked child adopts the connection:
 * nothing of the parent's is touched, and it connects again on first use), close (never
 * blocks), pinned buffers that outlive close. Above the request table, handles and the
 * stock; the blocking and event-loop faces, status and units call into it. */
#ifndef SHMREF_SESSION_H
#define SHMREF_SESSION_H

#include "conn.h"

/* client_usable: 0, or -ENOTCONN (abandoned after a timeout) / the error that broke the
 * connection, with the message set. In a forked child the connection is adopted first
 * and, unless closing, connected again to the same socket. */
int client_usable(shmref_conn *conn);
/* client_adopt: a forked child adopts the connection now if it has not (nothing is sent,
 * nothing connected). */
void client_adopt(shmref_conn *conn);
/* client_enter: the start of every public call on conn: usable, then take in whatever
 * replies have arrived (no blocking; when only stock refills are out, nothing: stock_take
 * takes them in when it needs them), errmsg cleared (or set to a late error). */
int client_enter(shmref_conn *conn);

/* CLIENT_ACQUIRE_WAIT_MS: an acquire waits at most this long for a publish by default
 * (less when the connection's timeout is shorter). */
#define CLIENT_ACQUIRE_WAIT_MS 2000
int client_acquire_wait_default(int timeout_ms);

/* client_pin / client_unpin: a buffer whose mapping and daemon-side reference must
 * outlive shmref_close (an acquired unit whose Arrow exports are still alive; in a forked
 * child, every inherited handle, which shmref_close pins). While a connection has pinned
 * buffers, shmref_close releases every other handle and keeps the mappings, and the
 * socket unless only inherited handles are pinned; client_unpin then releases the buffer
 * (on an open connection: shmref_release; after shmref_close: handle_forget_pinned, a
 * one-way release encoded on the stack, so it may run on any thread), and the unpin of
 * the last pinned buffer of a closed connection closes its socket, unmaps everything
 * and frees it. */
void client_pin(shmref_buf *buf);
void client_unpin(shmref_buf *buf);

#endif
