#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""test-listener.py: a listening socket that breaks under shmrefd (here: the service
manager's copy of the activated socket shut down) must not leave a deaf daemon spinning
on accept errors while its watchdog says it is alive: shmrefd logs the failure once and
exits 1, so the manager restarts it. Usage: test-listener.py SHMREFD SHMREFCTL"""
import os, socket, subprocess, sys, tempfile, time

shmrefd, shmrefctl = sys.argv[1], sys.argv[2]
passed = failed = 0


def check(name, ok):
    global passed, failed
    print(("PASS " if ok else "FAIL ") + name)
    if ok:
        passed += 1
    else:
        failed += 1


with tempfile.TemporaryDirectory(prefix="shmref-listener-") as tmp:
    path = os.path.join(tmp, "shmrefd.sock")
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ls.bind(path)
    ls.listen(16)
    log = open(os.path.join(tmp, "log"), "w+")
    pid = os.fork()
    if pid == 0:  # the daemon, with the socket as sd_listen_fds' fd 3
        if ls.fileno() != 3:
            os.dup2(ls.fileno(), 3)
        os.set_inheritable(3, True)
        os.environ.update(LISTEN_FDS="1", LISTEN_PID=str(os.getpid()))
        os.dup2(log.fileno(), 2)
        os.execv(shmrefd, [shmrefd, "--pool-size", "16M", "--pool-hugepages", "no"])
    def ping():
        try:
            return subprocess.run([shmrefctl, "--socket", path, "ping"], capture_output=True, timeout=5).returncode
        except subprocess.TimeoutExpired:
            return -1
    for _ in range(200):
        if ping() == 0:
            break
        time.sleep(0.05)
    check("the activated daemon serves", ping() == 0)
    ls.shutdown(socket.SHUT_RDWR)  # accept(2) now fails at once with EINVAL
    status = None
    deadline = time.time() + 5  # housekeeping looks once a second
    while time.time() < deadline:
        p, st = os.waitpid(pid, os.WNOHANG)
        if p:
            status = st
            break
        time.sleep(0.05)
    if status is None:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    check("shmrefd exits when its listening socket breaks", status is not None)
    check("with status 1", status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 1)
    log.seek(0)
    text = log.read()
    lines = [l for l in text.splitlines() if "listening socket failed" in l or "accept:" in l]
    check("and logs it once, not once per spin (%d lines)" % len(lines), len(lines) == 1)
    check("the line says why", "the listening socket failed (shut down)" in text)
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
