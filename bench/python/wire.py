# SPDX-License-Identifier: MIT
"""Framing for the Python benchmark's control socket: one Unix stream socket between the
client and the no-op server, each message an 8-byte little-endian length and the bytes.
Receives go straight into one preallocated buffer per message (no joins of chunks)."""

import socket
import struct
import time

_HDR = struct.Struct("<Q")


def send(sock, payload):
    """Send one message (bytes, bytearray or memoryview)."""
    sock.sendall(_HDR.pack(len(payload)))
    if len(payload):
        sock.sendall(payload)


def _recv_exact(sock, view):
    got = 0
    n = len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise EOFError("peer closed the socket mid-message")
        got += k


def recv(sock):
    """Receive one message as a bytearray, or None at a clean EOF between messages."""
    hdr = bytearray(_HDR.size)
    k = sock.recv_into(hdr, _HDR.size)
    if k == 0:
        return None
    if k < _HDR.size:
        _recv_exact(sock, memoryview(hdr)[k:])
    (n,) = _HDR.unpack(hdr)
    buf = bytearray(n)
    if n:
        _recv_exact(sock, memoryview(buf))
    return buf


def listen(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(1)
    return s


def connect(path, timeout_s=30.0):
    """Connect to a server that may still be starting: bounded retries, then the error."""
    deadline = time.monotonic() + timeout_s
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
