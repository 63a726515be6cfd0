# SPDX-License-Identifier: MIT
"""Arrow Flight for other machines (issue 10): shmref.flight.Server serves published units
by descriptor; shmref.flight.fetch acquires locally when it can and falls back to DoGet.
Server, producer and consumer are separate processes; over loopback, and across two
network namespaces joined by a veth pair that the test makes (skipped when `ip netns` is
not permitted)."""
import os
import shutil
import subprocess
import sys
import textwrap
import uuid

import pytest

pa = pytest.importorskip("pyarrow")
flight = pytest.importorskip("pyarrow.flight")

import arrow_cases
import shmref
import shmref.flight

HERE = os.path.dirname(os.path.abspath(__file__))
NO_DAEMON = "/nonexistent/shmrefd.sock"   # a consumer "on another machine": no daemon here

CONSUMER = """
    import sys, pyarrow as pa, shmref.flight, arrow_cases
    t = shmref.flight.fetch(sys.argv[1], location=sys.argv[2])
    want = arrow_cases.multi_batch()
    print("equal" if t.equals(want) else f"differs: {t}")
"""


def start_server(socket, listen, prefix=()):
    p = subprocess.Popen([*prefix, sys.executable, "-m", "shmref.flight", "--listen", listen, "--socket", socket],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE)
    line = p.stdout.readline().strip()
    if not line.startswith("grpc://"):
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


def consume(ref, location, prefix=()):
    env = dict(os.environ, SHMREFD_SOCKET=NO_DAEMON)
    r = subprocess.run([*prefix, sys.executable, "-c", textwrap.dedent(CONSUMER), str(ref), location], env=env,
                       capture_output=True, text=True, timeout=120, cwd=HERE)
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


def test_two_network_namespaces(daemon, client, netns):
    a, b = netns
    ref = client.publish_batch(arrow_cases.multi_batch())
    p, location = start_server(daemon.socket, "grpc://10.251.7.1:0", prefix=("ip", "netns", "exec", a))
    try:
        assert location.startswith("grpc://10.251.7.1:")
        assert consume(ref, location, prefix=("ip", "netns", "exec", b)) == "equal"
        # The server is not reachable from this (the host's) namespace: the bytes went over the veth.
        r = subprocess.run([sys.executable, "-c", "import socket, sys; s = socket.socket(); s.settimeout(2); "
                            f"sys.exit(s.connect_ex(('10.251.7.1', {location.rsplit(':', 1)[1]})) == 0)"],
                           timeout=30)
        assert r.returncode == 0
    finally:
        stop(p)
