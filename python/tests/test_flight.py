# SPDX-License-Identifier: MIT
"""Arrow Flight for other machines (issue 10): shmref.flight.Server serves published units
by descriptor; shmref.flight.fetch acquires locally when it can and falls back to DoGet.
Server, producer and consumer are separate processes; over loopback, and across two
network namespaces joined by a veth pair that the test makes (skipped when `ip netns` is
not permitted). Under the daemon's policy (issue 17 item 7): a uid the daemon refuses is
refused through Flight too; 1,100 abandoned DoGet streams leave the daemon's connections
bounded and its units released; streams are bounded per caller; the remote path refuses
to run without TLS and a token and works with them (certificates made with openssl)."""
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

pa = pytest.importorskip("pyarrow")
flight = pytest.importorskip("pyarrow.flight")

import arrow_cases
import shmref
import shmref.flight
from conftest import DIE_WITH_US, Daemon

HERE = os.path.dirname(os.path.abspath(__file__))
NO_DAEMON = "/nonexistent/shmrefd.sock"   # a consumer "on another machine": no daemon here

CONSUMER = """
    import sys, pyarrow as pa, shmref.flight, arrow_cases
    import os
    ca = os.environ.get("TEST_CA")
    t = shmref.flight.fetch(sys.argv[1], location=sys.argv[2], tls_root_certs=open(ca, "rb").read() if ca else None)
    want = arrow_cases.multi_batch()
    print("equal" if t.equals(want) else f"differs: {t}")
"""


def start_server(socket, listen, prefix=(), args=()):
    p = subprocess.Popen([*DIE_WITH_US, *prefix, sys.executable, "-m", "shmref.flight", "--listen", listen, "--socket", socket,
                          *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE)
    line = p.stdout.readline().strip()
    if not line.startswith(("grpc://", "grpc+tls://")):
        p.kill()
        pytest.fail(f"the Flight server did not start: {line} {p.stderr.read()}")
    return p, line


def stop(p):
    p.terminate()
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def consume(ref, location, prefix=(), env=None, check=True):
    env = dict(os.environ, SHMREFD_SOCKET=NO_DAEMON, **(env or {}))
    r = subprocess.run([*prefix, sys.executable, "-c", textwrap.dedent(CONSUMER), str(ref), location], env=env,
                       capture_output=True, text=True, timeout=120, cwd=HERE)
    if not check:
        return r
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture(scope="module")
def server(daemon):
    p, location = start_server(daemon.socket, "grpc://127.0.0.1:0")
    yield location
    stop(p)


def test_loopback_fallback(client, server):
    ref = client.publish_batch(arrow_cases.multi_batch())   # held by this client
    assert consume(ref, server) == "equal"                  # another process, no daemon: DoGet
    assert consume(ref, server) == "equal"                  # served again (the producer holds it)


def test_every_type_over_flight(client, server):
    with flight.connect(server) as fc:
        for name in arrow_cases.case_names():
            ref = client.publish_batch(arrow_cases.case(name))
            got = fc.do_get(flight.Ticket(str(ref).encode())).read_all()
            want = arrow_cases.case(name)
            want = want if isinstance(want, pa.Table) else pa.Table.from_batches([want])
            assert got.equals(want), name
            client.release(ref)


def test_flight_info(client, server):
    t = arrow_cases.multi_batch()
    ref = client.publish_batch(t)
    with flight.connect(server) as fc:
        info = fc.get_flight_info(flight.FlightDescriptor.for_command(str(ref)))
        assert info.schema.equals(t.schema) and info.total_records == t.num_rows
        assert fc.do_get(info.endpoints[0].ticket).read_all().equals(t)
        with pytest.raises(flight.FlightError, match="no published buffer"):
            fc.do_get(flight.Ticket(b"shmref1:" + b"0" * 32 + b":4096")).read_all()


def test_fetch_local_first(client, server):
    t = arrow_cases.all_types()
    ref = client.publish_batch(t)
    assert shmref.flight.fetch(ref, client=client).equals(pa.Table.from_batches([t]))   # no location: local only
    assert shmref.flight.fetch(str(ref), client=client, location=server).equals(pa.Table.from_batches([t]))
    missing = "shmref1:" + "0" * 32 + ":4096"
    with pytest.raises(FileNotFoundError):
        shmref.flight.fetch(missing, client=client)         # nowhere to fall back to


def test_fetch_falls_back_when_local_daemon_lacks_unit(client, server, own_daemon):
    """A daemon on this machine that is not the producer's: the unit is fetched by Flight."""
    t = arrow_cases.multi_batch()
    ref = client.publish_batch(t)
    with shmref.connect(own_daemon.socket) as other:
        assert shmref.flight.fetch(ref, client=other, location=server).equals(t)


# ---- two network namespaces joined by a veth pair ----

def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture
def netns():
    if shutil.which("ip") is None:
        pytest.skip("no `ip` (iproute2) on this machine")
    tag = uuid.uuid4().hex[:6]
    a, b = f"shmref-a-{tag}", f"shmref-b-{tag}"
    r = ip("netns", "add", a, check=False)
    if r.returncode != 0:
        pytest.skip(f"`ip netns add` is not permitted here: {r.stderr.strip()}")
    try:
        ip("netns", "add", b)
        ip("link", "add", f"va-{tag}", "netns", a, "type", "veth", "peer", "name", f"vb-{tag}", "netns", b)
        ip("-n", a, "addr", "add", "10.251.7.1/30", "dev", f"va-{tag}")
        ip("-n", b, "addr", "add", "10.251.7.2/30", "dev", f"vb-{tag}")
        for ns, dev in ((a, f"va-{tag}"), (b, f"vb-{tag}")):
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        ip("netns", "del", a, check=False)
        ip("netns", "del", b, check=False)
        pytest.skip(f"could not make the veth pair: {e.stderr.strip()}")
    yield a, b
    ip("netns", "del", a, check=False)
    ip("netns", "del", b, check=False)


def make_certificate(d, ip_address):
    """A self-signed certificate for ip_address (openssl), as (cert path, key path)."""
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=shmref-test", "-addext", f"subjectAltName=IP:{ip_address}", "-keyout", key, "-out", cert],
                   check=True, capture_output=True)
    return cert, key


def test_two_network_namespaces(daemon, client, netns, tmp_path):
    a, b = netns
    ref = client.publish_batch(arrow_cases.multi_batch())
    # Reachable from another machine without TLS and a token: it refuses to start.
    r = subprocess.run(["ip", "netns", "exec", a, sys.executable, "-m", "shmref.flight", "--listen",
                        "grpc://10.251.7.1:0", "--socket", daemon.socket], capture_output=True, text=True,
                       timeout=60, cwd=HERE)
    assert r.returncode == 2 and "needs TLS" in r.stderr, (r.returncode, r.stderr)
    cert, key = make_certificate(str(tmp_path), "10.251.7.1")
    token = uuid.uuid4().hex
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# flight tokens\n{token}\n")
    tokens.chmod(0o600)
    p, location = start_server(daemon.socket, "grpc+tls://10.251.7.1:0", prefix=("ip", "netns", "exec", a),
                               args=("--tls-cert", cert, "--tls-key", key, "--token-file", str(tokens)))
    try:
        assert location.startswith("grpc+tls://10.251.7.1:")
        netb = ("ip", "netns", "exec", b)
        r = consume(ref, location, prefix=netb, env={"TEST_CA": cert}, check=False)
        assert r.returncode != 0 and "token" in r.stderr, "no token: refused"
        r = consume(ref, location, prefix=netb, env={"TEST_CA": cert, "SHMREF_FLIGHT_TOKEN": "x" * 32}, check=False)
        assert r.returncode != 0 and "not one of this server's" in r.stderr, "a wrong token: refused"
        assert consume(ref, location, prefix=netb, env={"TEST_CA": cert, "SHMREF_FLIGHT_TOKEN": token}) == "equal"
        # The server is not reachable from this (the host's) namespace: the bytes went over the veth.
        r = subprocess.run([sys.executable, "-c", "import socket, sys; s = socket.socket(); s.settimeout(2); "
                            f"sys.exit(s.connect_ex(('10.251.7.1', {location.rsplit(':', 1)[1]})) == 0)"],
                           timeout=30)
        assert r.returncode == 0
    finally:
        stop(p)


# ---- the daemon's policy ----

OTHER_UID = 65534
AS_OTHER = ("setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups")

FETCH_AS_OTHER = """
    import sys, pyarrow.flight as flight
    with flight.connect(sys.argv[2]) as fc:
        try:
            fc.do_get(flight.Ticket(sys.argv[1].encode())).read_all()
            print("served")
        except flight.FlightUnauthenticatedError as e:
            print("refused:", e)
"""


def other_uid_runs_this_python() -> str:
    """Why uid OTHER_UID cannot run this venv's Python with shmref and pyarrow.flight
    (a checkout under a 0700 directory, as `mktemp -d` makes), or "" when it can."""
    r = subprocess.run([*AS_OTHER, sys.executable, "-c", "import shmref, pyarrow.flight"],
                       capture_output=True, text=True, timeout=60, cwd="/")
    return "" if r.returncode == 0 else (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a caller of another uid")
def test_a_uid_the_daemon_refuses_is_refused_through_flight():
    why = other_uid_runs_this_python()
    if why:
        pytest.skip(f"uid {OTHER_UID} cannot run {sys.executable} with this venv ({why}): the checkout is "
                    "not reachable by other uids (run from a world-readable directory to include this test)")
    d = Daemon("--allow-users", "0", "--socket-mode", "0666")
    os.chmod(d.dir, 0o755)
    try:
        with shmref.connect(d.socket) as c:
            ref = c.publish_batch(arrow_cases.multi_batch(), keep=60.0)
            # the premise: the daemon refuses the other uid
            r = subprocess.run([*AS_OTHER, sys.executable, "-c", "import shmref, sys; shmref.connect(sys.argv[1])",
                                d.socket], capture_output=True, text=True, timeout=60, cwd="/")
            assert r.returncode != 0 and "PermissionError" in r.stderr, r.stderr
            p, location = start_server(d.socket, "grpc://127.0.0.1:0")
            try:
                r = subprocess.run([*AS_OTHER, sys.executable, "-c", textwrap.dedent(FETCH_AS_OTHER), str(ref),
                                    location], capture_output=True, text=True, timeout=60, cwd="/")
                assert r.returncode == 0, r.stderr
                assert r.stdout.startswith("refused:") and f"uid {OTHER_UID} is not allowed" in r.stdout, r.stdout
                assert consume(ref, location) == "equal", "root (allowed by the daemon) is served"
            finally:
                stop(p)
            # a server given the uid (as the daemon would be) serves it
            p, location = start_server(d.socket, "grpc://127.0.0.1:0", args=("--allow-users", str(OTHER_UID)))
            try:
                r = subprocess.run([*AS_OTHER, sys.executable, "-c", textwrap.dedent(FETCH_AS_OTHER), str(ref),
                                    location], capture_output=True, text=True, timeout=60, cwd="/")
                assert r.stdout.strip() == "served", (r.stdout, r.stderr)
            finally:
                stop(p)
    finally:
        d.stop()


def test_abandoned_streams_leave_nothing_held_in_the_daemon(daemon, client):
    """1,100 DoGet streams opened and never read: at every moment the daemon sees a bounded
    number of connections and the unit has no holder but its producer (each DoGet's
    acquire ends with its copy). Before: a stream held its unit, its acquire and a daemon
    connection for as long as the client kept it unread."""
    t = pa.table({"x": pa.array(range(75_000), pa.int64())})   # 600 kB: more than gRPC's window
    ref = client.publish_batch(t)
    server = shmref.flight.Server(socket=daemon.socket, max_streams_per_caller=64, stream_timeout=600)
    most_clients = most_holders = refused = 0
    readers = []

    def sample():
        nonlocal most_clients, most_holders
        st = daemon.status()
        most_clients = max(most_clients, len(st["clients"]))
        most_holders = max(most_holders, st["buffers"]["list"][0]["holders"])

    try:
        with flight.connect(server.location) as fc:
            for i in range(1100):
                try:
                    readers.append(fc.do_get(flight.Ticket(str(ref).encode())))
                except flight.FlightUnavailableError as e:   # past the bound: refused, with the numbers
                    assert "at most 64 per caller" in str(e)
                    refused += 1
                if i % 25 == 0:
                    sample()
            sample()
            assert most_holders == 1, f"a stream held the unit ({most_holders} holders)"
            assert most_clients <= 4, f"{most_clients} daemon connections while 1,100 streams were open"
            assert len(readers) + refused == 1100 and len(readers) >= 64
            assert readers[-1].read_all().equals(t)
            del readers
    finally:
        server.shutdown()


def test_streams_are_bounded_per_caller(daemon, client):
    # 64 batches of 256 kB: an unread client takes the first one (its pending read), then
    # flow control stops the server, so the call stays open (one big batch would be read
    # whole by that pending read, and the call would end). The client turns gRPC's BDP
    # probing off: with it, the receive window grows to many MB, and an unread call whose
    # 16 MB fit in the window ends (CI once saw 1 of 3 still open after 10 s).
    one = pa.record_batch({"x": pa.array(range(32_768), pa.int64())})
    t = pa.Table.from_batches([one] * 64)
    ref = client.publish_batch(t)
    server = shmref.flight.Server(socket=daemon.socket, max_streams=100, max_streams_per_caller=3)
    readers = []
    try:
        with flight.connect(server.location, generic_options=[("grpc.http2.bdp_probe", 0)]) as fc:
            readers += [fc.do_get(flight.Ticket(str(ref).encode())) for _ in range(3)]
            # do_get may return before the server has run the call's handler: wait for all 3
            deadline = time.monotonic() + 10
            while server.streams_open < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert server.streams_open == 3, f"{server.streams_open} of the 3 unread calls are still open"
            with pytest.raises(flight.FlightUnavailableError, match="uid 0 has 3 streams open, at most 3"):
                fc.do_get(flight.Ticket(str(ref).encode())).read_all()
            assert readers[0].read_all().equals(t)       # read to its end: its slot is free again
            deadline = time.monotonic() + 10
            while server.streams_open > 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert fc.do_get(flight.Ticket(str(ref).encode())).read_all().equals(t)
    finally:
        # the client's end of the calls, also when an assertion failed: the server's
        # shutdown waits for every call that is still open (pyarrow has no deadline for it)
        for r in readers:
            r.cancel()
        readers.clear()
        server.shutdown()


def test_a_non_loopback_server_needs_tls_and_tokens(daemon):
    with pytest.raises(ValueError, match="needs TLS"):
        shmref.flight.Server("grpc://0.0.0.0:0", socket=daemon.socket)
    with pytest.raises(ValueError, match="needs TLS"):
        shmref.flight.Server("grpc://0.0.0.0:0", socket=daemon.socket, tokens=["t"])


def test_peer_uid_reads_the_kernels_socket_table():
    import socket
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    cli = socket.create_connection(srv.getsockname())
    conn, _ = srv.accept()
    try:
        host, port = cli.getsockname()
        assert shmref.flight.peer_uid(f"ipv4:{host}:{port}", srv.getsockname()[1]) == os.geteuid()
        assert shmref.flight.peer_uid(f"ipv4:10.1.2.3:{port}", srv.getsockname()[1]) is None
        assert shmref.flight.peer_uid(f"ipv4:{host}:{port}", srv.getsockname()[1] + 1) is None
    finally:
        conn.close()
        cli.close()
        srv.close()
