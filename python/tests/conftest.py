# SPDX-License-Identifier: MIT
"""Fixtures: a real shmrefd (this build's, $SHMREFD_BIN) on a temporary socket."""
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

import shmref


# A process the suite starts goes with the test process (util-linux's setpriv sets its
# parent-death signal before exec): a killed or timed-out run leaves no daemon behind.
DIE_WITH_US = ["setpriv", "--pdeathsig", "TERM", "--"] if shutil.which("setpriv") else []


class Daemon:
    """One shmrefd on a socket in a fresh temporary directory."""

    def __init__(self, *args, socket=None):
        self.dir = tempfile.mkdtemp(prefix="shmref-py-")
        self.socket = socket or os.path.join(self.dir, "shmrefd.sock")
        self.log_path = os.path.join(self.dir, "shmrefd.log")
        binary = os.environ.get("SHMREFD_BIN")
        if not binary:
            pytest.fail("SHMREFD_BIN is not set: run through ctest (./scripts/test) or python/tests/run.sh")
        self.log = open(self.log_path, "wb")
        # As root, --user root: the suite's daemons stay uid 0 as before (a root shmrefd
        # given no --user becomes an unprivileged user; tests/cli/test-cli.sh checks that).
        user = ["--user", "root"] if os.geteuid() == 0 and "--user" not in args else []
        self.proc = subprocess.Popen([*DIE_WITH_US, binary, "--socket", self.socket, "--pool-size", "512M", *user, *args],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                with shmref.connect(self.socket, timeout=5) as c:
                    c.ping()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"shmrefd did not start:\n{self.text()}")
                time.sleep(0.02)

    def text(self):
        self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def status(self):
        with shmref.connect(self.socket, timeout=10) as c:
            return c.status()

    def leases(self, client):
        """The daemon's lease count once client's lease stock is handed back: the stock (on
        by default, as users run it) keeps ready leases that no array holds, and a test that
        counts leases counts its arrays'. The refills in flight are released as their
        replies are read (a reply with an fd may be held back behind the daemon's fd caps
        while a ping's reply is not), so the count is read until it is the same three times
        in a row, a ping before each (a state, not a time). The stock fills again at the
        client's next lease."""
        client.set_stock(0)
        last, same, deadline = None, 0, time.monotonic() + 10
        while True:
            client.ping()
            n = self.status()["buffers"]["leases"]
            same = same + 1 if n == last else 0
            last = n
            if same >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        client.set_stock(-1)
        return last

    def wait_status(self, path, want, seconds=5.0):
        """Polls a dotted status key until it equals want; returns the last value."""
        deadline = time.monotonic() + seconds
        while True:
            v = self.status()
            for k in path.split("."):
                v = v[k]
            if v == want or time.monotonic() > deadline:
                return v
            time.sleep(0.02)

    def stop(self, check=True):
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                if check:
                    pytest.fail(f"shmrefd did not stop on SIGTERM:\n{self.text()}")
            if check and self.proc.returncode != 0:
                pytest.fail(f"shmrefd exited {self.proc.returncode}:\n{self.text()}")
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon():
    """A shmrefd shared by the tests of one module; $SHMREFD_SOCKET points at it, so child
    processes (spawn, forkserver) and shmref's default client find it too."""
    d = Daemon()
    old = os.environ.get("SHMREFD_SOCKET")
    os.environ["SHMREFD_SOCKET"] = d.socket
    yield d
    if old is None:
        os.environ.pop("SHMREFD_SOCKET", None)
    else:
        os.environ["SHMREFD_SOCKET"] = old
    d.stop()


@pytest.fixture
def own_daemon():
    """A shmrefd for one test (for tests that stop or kill it)."""
    d = Daemon()
    yield d
    d.stop(check=False)


@pytest.fixture
def client(daemon):
    with shmref.connect(daemon.socket, timeout=20) as c:
        yield c
