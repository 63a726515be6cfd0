# SPDX-License-Identifier: MIT
"""Arrow Flight for consumers on other machines (needs pyarrow with Flight).

A consumer on another machine cannot map a unit's bytes, so the same descriptor also
works through Flight: :class:`Server` runs next to shmrefd and serves published units by
descriptor (the ticket is the ``shmref1:`` text); ``DoGet`` acquires the unit locally,
copies its record batches once into the server's memory and releases the unit at once,
then streams the copy. :func:`fetch` acquires locally when the daemon is reachable on this
machine and has the unit, and falls back to ``DoGet`` otherwise::

    # on the producer's machine, next to shmrefd: loopback callers only, checked by uid
    python -m shmref.flight --listen grpc://127.0.0.1:8815 --allow-users 1000,1001

    # for other machines: TLS and a bearer token, or it refuses to start
    python -m shmref.flight --listen grpc+tls://0.0.0.0:8815 --tls-cert c.pem --tls-key k.pem \\
        --token-file /etc/shmref/flight-tokens

    # anywhere
    table = shmref.flight.fetch(ref, location="grpc+tls://producer-host:8815", token=..., tls_root_certs=...)

The server is under the daemon's policy (it would otherwise be a confused deputy: a uid
the daemon refuses would fetch units through it):

- A caller on loopback is identified by the uid that owns its TCP socket (the kernel's
  socket table, /proc/net/tcp and tcp6) and served only if that uid is allowed: root, the
  server's own uid, and the uids and groups given (``allow_users``, ``allow_groups``, as
  shmrefd's ``--allow-users`` / ``--allow-groups``: give the server the daemon's lists).
  With no list the server is stricter than any daemon (root and its own uid only).
- A caller that presents one of the server's tokens (``authorization: Bearer <token>``)
  is served from anywhere. Listening on anything but loopback needs both TLS
  (``tls_certificates``) and tokens: the server refuses to start otherwise.
- Streams are bounded: at most ``max_streams`` at once and ``max_streams_per_caller``
  per caller (uid or token); past either the call is refused with the numbers.
- A DoGet holds its unit only while it copies it (one daemon connection per DoGet, closed
  with the copy), so clients that abandon their streams (never read, cancel, vanish)
  leave nothing held in the daemon; a stream that is not finished ``stream_timeout``
  seconds after it started stops at its next batch (its copy is freed once gRPC lets go).
- Units of another uid that are not sealed are refused (PermissionError from
  :meth:`shmref.Client.acquire_batch`) unless ``trust_producer=True``: the copy reads the
  producer's offsets, which an unsealed producer could rewrite while it runs.
"""
from __future__ import annotations

import argparse
import grp
import hmac
import ipaddress
import os
import pwd
import sys
import threading
import time
from typing import Any, Iterable, Optional

import pyarrow as pa
import pyarrow.flight as flight

import shmref

__all__ = ["Server", "fetch", "LOCATION_ENV", "TOKEN_ENV", "peer_uid"]

#: The environment variable :func:`fetch` takes the Flight location from when none is given.
LOCATION_ENV = "SHMREF_FLIGHT"
#: The environment variable :func:`fetch` takes the bearer token from when none is given.
TOKEN_ENV = "SHMREF_FLIGHT_TOKEN"

_AUTH = "shmref-auth"


def _ref_text(ref: Any) -> str:
    if isinstance(ref, (bytes, bytearray)):
        ref = bytes(ref).decode()
    return str(shmref.Ref(ref) if not isinstance(ref, shmref.Ref) else ref)


# ---- who is calling ----

def _parse_peer(peer: str):
    """gRPC's peer string ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000", "ipv6:%5B::1%5D:5000")
    as (ip_address, port), or None."""
    from urllib.parse import unquote
    peer = unquote(peer)
    try:
        kind, rest = peer.split(":", 1)
        if kind not in ("ipv4", "ipv6"):
            return None
        host, port = rest.rsplit(":", 1)
        return ipaddress.ip_address(host.strip("[]")), int(port)
    except ValueError:
        return None


def _proc_addr(field: str, v6: bool):
    """An address of /proc/net/tcp{,6} ("0100007F:1F90") as (ip_address, port)."""
    hexip, hexport = field.split(":")
    raw = bytes.fromhex(hexip)
    # the kernel prints each 32-bit word in host (little-endian) order
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    ip = ipaddress.IPv6Address(raw) if v6 else ipaddress.IPv4Address(raw)
    if v6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip, int(hexport, 16)


def peer_uid(peer: str, server_port: int) -> Optional[int]:
    """The uid that owns the loopback TCP socket gRPC calls ``peer`` and that is connected
    to ``server_port`` on this machine (the kernel's socket table, as ``ss -e`` shows it),
    or None when the peer is not a loopback socket found there."""
    got = _parse_peer(peer)
    if got is None:
        return None
    ip, port = got
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if not ip.is_loopback:
        return None
    for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    if len(fields) < 8 or fields[3] != "01":  # ESTABLISHED
                        continue
                    local, remote = _proc_addr(fields[1], v6), _proc_addr(fields[2], v6)
                    if local == (ip, port) and remote[1] == server_port and remote[0].is_loopback:
                        return int(fields[7])
        except OSError:
            continue
    return None


def _ids(values: Optional[Iterable[Any]], lookup) -> set:
    out = set()
    for v in values or ():
        if isinstance(v, int) or str(v).isdigit():
            out.add(int(v))
        else:
            out.add(lookup(str(v)))
    return out


class _AuthMiddleware(flight.ServerMiddleware):
    def __init__(self, token: Optional[str]):
        self.token = token


class _AuthFactory(flight.ServerMiddlewareFactory):
    """Keeps the bearer token a call came with (the handlers decide)."""

    def start_call(self, info, headers):
        for v in headers.get("authorization", []):
            v = v.decode() if isinstance(v, bytes) else v
            if v.startswith("Bearer "):
                return _AuthMiddleware(v[len("Bearer "):].strip())
        return _AuthMiddleware(None)


class Server(flight.FlightServerBase):
    """A Flight server over one shmrefd: ``DoGet(ticket)`` streams the unit whose
    descriptor text is the ticket; ``GetFlightInfo`` of a command descriptor holding the
    text gives its schema and one endpoint (this server). location: where to listen
    (``grpc://127.0.0.1:0`` picks a free port; see :attr:`port`); socket: shmrefd's
    socket (None: the default rule). Who may call, the bounds and the timeout: see the
    module's documentation. Other keyword arguments go to pyarrow's
    ``FlightServerBase`` (middleware ...)."""

    def __init__(self, location: str = "grpc://127.0.0.1:0", *, socket: Optional[str] = None,
                 allow_users: Optional[Iterable[Any]] = None, allow_groups: Optional[Iterable[Any]] = None,
                 tokens: Optional[Iterable[str]] = None, tls_certificates: Optional[list] = None,
                 max_streams: int = 64, max_streams_per_caller: int = 8, stream_timeout: float = 60.0,
                 trust_producer: bool = False, **kwargs: Any):
        scheme, _, rest = location.partition("://")
        host = rest.rsplit(":", 1)[0].strip("[]")
        self._tokens = [t for t in (tokens or ()) if t]
        if not _is_loopback_host(host) and not (tls_certificates and self._tokens):
            raise ValueError(f"shmref.flight: refusing to listen on {location}: a server reachable from other "
                             "machines needs TLS (tls_certificates) and tokens; loopback needs neither")
        if max_streams < 1 or max_streams_per_caller < 1 or stream_timeout <= 0:
            raise ValueError("max_streams and max_streams_per_caller must be >= 1, stream_timeout > 0")
        if tls_certificates and scheme in ("grpc", "grpc+tcp"):
            scheme = "grpc+tls"
            location = f"{scheme}://{rest}"
        middleware = dict(kwargs.pop("middleware", None) or {})
        middleware[_AUTH] = _AuthFactory()
        super().__init__(location, tls_certificates=tls_certificates or [], middleware=middleware, **kwargs)
        self._uids = {0, os.geteuid()} | _ids(allow_users, lambda n: pwd.getpwnam(n).pw_uid)
        self._gids = _ids(allow_groups, lambda n: grp.getgrnam(n).gr_gid)
        self._max_streams, self._max_per_caller = max_streams, max_streams_per_caller
        self._stream_timeout = stream_timeout
        self._trust = trust_producer
        self._lock = threading.Lock()
        self._streams: dict = {}   # caller -> streams open
        self._client = shmref.connect(socket)
        self._location = f"{scheme}://{'[' + host + ']' if ':' in host else host}:{self.port}"

    @property
    def location(self) -> str:
        """The location clients connect to (with the port actually bound)."""
        return self._location

    @property
    def streams_open(self) -> int:
        """DoGet streams not finished yet."""
        with self._lock:
            return sum(self._streams.values())

    # ---- authentication ----

    def _uid_allowed(self, uid: int) -> bool:
        if uid in self._uids:
            return True
        if not self._gids:
            return False
        try:
            pw = pwd.getpwuid(uid)
        except KeyError:
            return False
        return bool(self._gids & set(os.getgrouplist(pw.pw_name, pw.pw_gid)))

    def _caller(self, context: Any) -> str:
        """Who is calling ("uid 1000", "token 2"), or FlightUnauthenticatedError."""
        mw = context.get_middleware(_AUTH)
        token = mw.token if mw is not None else None
        if token is not None:
            for i, t in enumerate(self._tokens):
                if hmac.compare_digest(t.encode(), token.encode()):
                    return f"token {i}"
            raise flight.FlightUnauthenticatedError("shmref.flight: the token is not one of this server's")
        peer = context.peer()
        uid = peer_uid(peer, self.port)
        if uid is None:
            raise flight.FlightUnauthenticatedError(
                f"shmref.flight: {peer} is not a loopback caller this server can identify: present a token")
        if not self._uid_allowed(uid):
            raise flight.FlightUnauthenticatedError(
                f"shmref.flight: uid {uid} is not allowed (allowed: uids {sorted(self._uids)}, "
                f"groups {sorted(self._gids)})")
        return f"uid {uid}"

    # ---- streams ----

    def _open_stream(self, caller: str) -> None:
        with self._lock:
            total = sum(self._streams.values())
            mine = self._streams.get(caller, 0)
            if total >= self._max_streams:
                raise flight.FlightUnavailableError(
                    f"shmref.flight: {total} streams open, at most {self._max_streams}: try again later")
            if mine >= self._max_per_caller:
                raise flight.FlightUnavailableError(
                    f"shmref.flight: {caller} has {mine} streams open, at most {self._max_per_caller} per caller")
            self._streams[caller] = mine + 1

    def _close_stream(self, caller: str) -> None:
        with self._lock:
            n = self._streams.get(caller, 0) - 1
            if n > 0:
                self._streams[caller] = n
            else:
                self._streams.pop(caller, None)

    def _acquire(self, text: str) -> "shmref.Batch":
        try:
            return self._client.acquire_batch(text, trust_producer=self._trust)
        except FileNotFoundError as e:
            raise flight.FlightServerError(f"shmref: {text}: {e.strerror}") from e
        except (ValueError, OSError) as e:
            raise flight.FlightServerError(f"shmref: {text}: {e}") from e

    def _copy(self, text: str) -> pa.Table:
        """The unit's batches copied into this process (IPC bytes): the unit and its daemon
        connection are released before anything is streamed."""
        with self._acquire(text) as b:
            data = _ipc_bytes(b)
        return pa.ipc.open_stream(data).read_all()

    def do_get(self, context: Any, ticket: flight.Ticket) -> flight.FlightDataStream:
        caller = self._caller(context)
        text = _ref_text(ticket.ticket)
        self._open_stream(caller)
        try:
            table = self._copy(text)
        except BaseException:
            self._close_stream(caller)
            raise
        stream = _Stream(self, caller, table, time.monotonic() + self._stream_timeout, context)
        # RecordBatchStream (not GeneratorStream) sends dictionaries as IPC requires; the
        # reader holds the stream until the call ends, whose __del__ frees the slot then.
        return flight.RecordBatchStream(pa.RecordBatchReader.from_batches(table.schema, stream))

    def get_flight_info(self, context: Any, descriptor: flight.FlightDescriptor) -> flight.FlightInfo:
        self._caller(context)
        if descriptor.descriptor_type != flight.DescriptorType.CMD:
            raise flight.FlightServerError("shmref: a command descriptor holding the shmref1: text")
        text = _ref_text(descriptor.command)
        with self._acquire(text) as b:
            schema, rows = b.schema, b.num_rows
        endpoint = flight.FlightEndpoint(text.encode(), [self._location])
        return flight.FlightInfo(schema, descriptor, [endpoint], rows, -1)

    def list_flights(self, context: Any, criteria: bytes):
        self._caller(context)
        return iter(())

    def shutdown(self) -> None:
        super().shutdown()
        self._client.close()


class _Stream:
    """The batches of one DoGet. It counts as one of its caller's streams until gRPC lets
    go of the call (the reader that holds it is destroyed: the client read it all,
    cancelled or went away), not merely until the last batch was handed over; it stops
    early when the call is cancelled or its deadline passes."""

    def __init__(self, server: "Server", caller: str, table: pa.Table, deadline: float, context: Any):
        self._server, self._caller, self._deadline, self._context = server, caller, deadline, context
        self._it = iter(table.to_batches())
        self._open = True

    def __iter__(self) -> "_Stream":
        return self

    def __next__(self) -> pa.RecordBatch:
        if self._context.is_cancelled() or time.monotonic() > self._deadline:
            self._it = iter(())
        return next(self._it)

    def close(self) -> None:
        if self._open:
            self._open = False
            self._server._close_stream(self._caller)

    def __del__(self) -> None:
        self.close()


def _ipc_bytes(batch: "shmref.Batch") -> pa.Buffer:
    """Every record batch of an acquired unit, as IPC stream bytes in this process's memory
    (nothing from the mapping stays referenced once this returns)."""
    reader = pa.RecordBatchReader.from_stream(batch)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, reader.schema) as w:
        for rb in reader:
            w.write_batch(rb)
    return sink.getvalue()


def _is_loopback_host(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def fetch(ref: Any, *, client: Optional["shmref.Client"] = None, location: Optional[str] = None,
          token: Optional[str] = None, tls_root_certs: Optional[bytes] = None) -> pa.Table:
    """The unit ``ref`` as a pyarrow.Table: acquired zero-copy from this machine's shmrefd
    (through client, or a connection made by the default rule) when it is reachable and
    has the unit; otherwise fetched with Flight ``DoGet`` from location (default
    ``$SHMREF_FLIGHT``), presenting token (default ``$SHMREF_FLIGHT_TOKEN``) and checking
    the server's certificate against tls_root_certs (PEM) for a ``grpc+tls://`` location.
    Raises the local error when there is no location to fall back to."""
    text = _ref_text(ref)
    location = location or os.environ.get(LOCATION_ENV) or None
    token = token or os.environ.get(TOKEN_ENV) or None
    local_error: Optional[BaseException] = None
    own = None
    try:
        if client is None:
            client = own = shmref.connect(timeout=5)
        with client.acquire_batch(text) as b:
            return pa.table(b)
    except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError, PermissionError, TimeoutError) as e:
        local_error = e         # no daemon here, or the unit is not on this machine (or refused here)
    finally:
        if own is not None:
            own.close()
    if location is None:
        raise local_error
    kw = {"tls_root_certs": tls_root_certs} if tls_root_certs else {}
    headers = [(b"authorization", b"Bearer " + token.encode())] if token else []
    with flight.connect(location, **kw) as fc:
        return fc.do_get(flight.Ticket(text.encode()), flight.FlightCallOptions(headers=headers)).read_all()


def _read_tokens(path: str) -> list:
    with open(path) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def main(argv: Optional[list] = None) -> int:
    """python -m shmref.flight [--listen LOCATION] [--socket PATH] [--allow-users LIST]
    [--allow-groups LIST] [--tls-cert PEM --tls-key PEM] [--token-file FILE]
    [--max-streams N] [--max-streams-per-caller N] [--stream-timeout SECONDS]
    [--trust-producer]: serve until killed; prints the location (with the port bound) on
    its first line."""
    p = argparse.ArgumentParser(prog="python -m shmref.flight", description=main.__doc__)
    p.add_argument("--listen", default="grpc://127.0.0.1:8815", help="grpc://HOST:PORT (port 0: any free one)")
    p.add_argument("--socket", default=None, help="shmrefd's socket (default: the C library's rule)")
    p.add_argument("--allow-users", default="", help="uids or names allowed on loopback (besides root and "
                   "the server's own uid), comma-separated: give shmrefd's --allow-users")
    p.add_argument("--allow-groups", default="", help="groups allowed on loopback, comma-separated")
    p.add_argument("--tls-cert", help="the server's certificate chain (PEM)")
    p.add_argument("--tls-key", help="its private key (PEM)")
    p.add_argument("--token-file", help="bearer tokens, one a line (never on the command line: every "
                   "user can read it)")
    p.add_argument("--max-streams", type=int, default=64)
    p.add_argument("--max-streams-per-caller", type=int, default=8)
    p.add_argument("--stream-timeout", type=float, default=60.0, help="seconds a DoGet stream may take")
    p.add_argument("--trust-producer", action="store_true", help="serve other uids' unsealed units")
    a = p.parse_args(argv)
    if bool(a.tls_cert) != bool(a.tls_key):
        p.error("--tls-cert and --tls-key go together")
    tls = []
    if a.tls_cert:
        with open(a.tls_cert, "rb") as c, open(a.tls_key, "rb") as k:
            tls = [flight.CertKeyPair(c.read(), k.read())]
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    try:
        server = Server(a.listen, socket=a.socket, allow_users=split(a.allow_users),
                        allow_groups=split(a.allow_groups), tokens=_read_tokens(a.token_file) if a.token_file else None,
                        tls_certificates=tls, max_streams=a.max_streams,
                        max_streams_per_caller=a.max_streams_per_caller, stream_timeout=a.stream_timeout,
                        trust_producer=a.trust_producer)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    print(server.location, flush=True)
    try:
        server.serve()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
