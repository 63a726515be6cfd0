# SPDX-License-Identifier: MIT
"""Units across uids (issue 17 item 6) from Python: publish_batch(sealed=True) on a memfd
pool; acquire_batch refuses another uid's unsealed unit (PermissionError) unless
trust_producer=True; a unit of the caller's own uid is taken unsealed; sealed=True
refuses any unsealed unit. Producers are forked processes of uid 65534, the consumer is
this process (root)."""
import errno
import os

import pytest

import shmref
from conftest import Daemon

pa = pytest.importorskip("pyarrow")

OTHER_UID = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a producer of another uid")


@pytest.fixture(scope="module")
def memfd_daemon():
    d = Daemon("--memfd", "--socket-mode", "0666")
    os.chmod(d.dir, 0o755)  # the other uid reaches the socket
    yield d
    d.stop()


def table():
    return pa.table({"s": pa.array(["a", None, "ccc", "dddd"] * 50), "i": pa.array(range(200), pa.int64())})


def produce(socket, uid, **kw):
    """A forked process of uid publishes table() (kept 60 s) and exits; its Ref text."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.close(r)
            if uid:
                os.setgid(uid)
                os.setuid(uid)
            with shmref.connect(socket, timeout=10) as c:
                os.write(w, str(c.publish_batch(table(), keep=60.0, **kw)).encode())
            code = 0
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            os.write(w, f"error {e!r}".encode())
        finally:
            os._exit(code)
    os.close(w)
    out = b""
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        out += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    text = out.decode()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, text
    return text


def test_a_sealed_unit_of_another_uid_is_taken(memfd_daemon):
    ref = produce(memfd_daemon.socket, OTHER_UID, sealed=True)
    with shmref.connect(memfd_daemon.socket) as c:
        with c.acquire_batch(ref) as b:
            assert pa.table(b).equals(table())
        with c.acquire_batch(ref, sealed=True) as b:
            assert pa.table(b).equals(table())


def test_an_unsealed_unit_of_another_uid_is_refused_unless_trusted(memfd_daemon):
    ref = produce(memfd_daemon.socket, OTHER_UID)
    with shmref.connect(memfd_daemon.socket) as c:
        with pytest.raises(PermissionError, match="not sealed") as e:
            c.acquire_batch(ref)
        assert e.value.errno == errno.EPERM
        with pytest.raises(PermissionError):
            c.acquire_batch(ref, sealed=True)
        with c.acquire_batch(ref, trust_producer=True) as b:
            assert pa.table(b).equals(table())


def test_an_unsealed_unit_of_the_same_uid_is_taken(memfd_daemon):
    ref = produce(memfd_daemon.socket, 0)
    with shmref.connect(memfd_daemon.socket) as c:
        with c.acquire_batch(ref) as b:
            assert pa.table(b).equals(table())
        with pytest.raises(PermissionError, match="not sealed"):
            c.acquire_batch(ref, sealed=True)


def test_sealed_needs_a_memfd_pool(client):
    with pytest.raises(OSError) as e:
        client.publish_batch(table(), sealed=True)
    assert e.value.errno == errno.EOPNOTSUPP, e.value
    assert "memfd" in str(e.value) or "sealed" in str(e.value)
