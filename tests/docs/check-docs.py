#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""check-docs.py: every example in README.md and docs/*.md that is marked runnable runs,
as written, against a real shmrefd that this check starts on a temporary socket.

A fenced block is runnable when its info string says so:
    ```sh runnable            run with bash -e (-o pipefail) in the file's scratch directory
    ```python runnable [FILE] run with the venv's python (written to FILE first if named)
    ```c runnable FILE        written to FILE, for a later sh block to build and run
Blocks of one markdown file run in order in one scratch directory, so a C file written by
one block is compiled by the next. The scratch directory holds `build-release` and `build`
(links to the build under test) and `client-lib`, `python` (links into the source tree),
so commands read exactly as the docs print them; PATH has the venv's bin and the build's
bin (`shmrefctl` as if installed). $SHMREFD_SOCKET names the daemon's
temporary socket, which is where libshmref, shmrefctl and the Python package look first.

Also checked: README.md is at most 250 lines, shows ./scripts/run and ./scripts/test,
and has runnable sh, c and python blocks (so this check cannot pass by finding nothing).

Usage: check-docs.py SOURCE_DIR BUILD_DIR SHMREFD PYTHON
"""
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time

FENCE = re.compile(r"^( *)```(\w+)([^\n]*)\n(.*?)^ *```\s*$", re.S | re.M)


def blocks(path):
    text = open(path, encoding="utf-8").read()
    for m in FENCE.finditer(text):
        words = m.group(3).split()
        if "runnable" not in words:
            continue
        words.remove("runnable")
        line = text.count("\n", 0, m.start()) + 1
        body = textwrap.dedent(m.group(4)) if m.group(1) else m.group(4)
        yield line, m.group(2), (words[0] if words else None), body


def start_daemon(shmrefd, tmp):
    sock = os.path.join(tmp, "shmrefd.sock")
    log = open(os.path.join(tmp, "shmrefd.log"), "w")
    p = subprocess.Popen([shmrefd, "--socket", sock, "--pool-size", "512M", "--tenant-quota", "400M",
                          "--pool-hugepages", "no"], stdout=log, stderr=log)
    for _ in range(200):
        if os.path.exists(sock):
            return p, sock
        if p.poll() is not None:
            break
        time.sleep(0.05)
    sys.exit("shmrefd did not start: " + open(log.name).read())


def main():
    src, build, shmrefd, python = sys.argv[1:5]
    failed = passed = 0
    readme = os.path.join(src, "README.md")
    lines = open(readme, encoding="utf-8").read().count("\n")
    text = open(readme, encoding="utf-8").read()
    kinds = {kind for _, kind, _, _ in blocks(readme)}

    def result(ok, what):
        nonlocal failed, passed
        print(("PASS " if ok else "FAIL ") + what, flush=True)
        if ok:
            passed += 1
        else:
            failed += 1

    result(lines <= 250, f"README.md has {lines} lines (at most 250)")
    result("./scripts/run" in text and "./scripts/test" in text, "README.md shows ./scripts/run and ./scripts/test")
    result({"sh", "c", "python"} <= kinds, f"README.md has runnable sh, c and python blocks (has {sorted(kinds)})")

    docs = [readme] + sorted(os.path.join(src, "docs", f) for f in os.listdir(os.path.join(src, "docs"))
                             if f.endswith(".md"))
    with tempfile.TemporaryDirectory(prefix="shmref-docs-") as tmp:
        daemon, sock = start_daemon(shmrefd, tmp)
        env = dict(os.environ, SHMREFD_SOCKET=sock,
                   PATH=os.path.dirname(python) + ":" + os.path.join(build, "bin") + ":" + os.environ.get("PATH", "/usr/bin:/bin"))
        env.pop("XDG_RUNTIME_DIR", None)
        # A sanitized build (./scripts/test --sanitize): programs the blocks build with plain
        # cc link an ASan libshmref, so the ASan runtime is preloaded for them (leak checks
        # off: they would report the shell's).
        ldd = subprocess.run(["ldd", os.path.join(build, "lib", "libshmref.so")], capture_output=True, text=True)
        asan = re.search(r"^\s*libasan\.so\S* => (\S+)", ldd.stdout, re.M)
        if asan:
            env.update(LD_PRELOAD=asan.group(1), ASAN_OPTIONS="detect_leaks=0")
        try:
            for doc in docs:
                name = os.path.relpath(doc, src)
                scratch = tempfile.mkdtemp(prefix=os.path.basename(doc) + "-", dir=tmp)
                for link, target in (("build-release", build), ("build", build),
                                     ("client-lib", os.path.join(src, "client-lib")),
                                     ("python", os.path.join(src, "python"))):
                    os.symlink(target, os.path.join(scratch, link))
                for line, kind, fname, body in blocks(doc):
                    where = f"{name}:{line} ({kind}{' ' + fname if fname else ''})"
                    if fname:
                        with open(os.path.join(scratch, fname), "w") as f:
                            f.write(body)
                    if kind == "sh":
                        cmd = ["bash", "-euo", "pipefail", "-c", body]
                    elif kind == "python":
                        cmd = [python, fname] if fname else [python, "-c", body]
                    elif kind == "c":
                        if not fname:
                            result(False, where + ": a runnable C block needs a file name")
                        continue
                    else:
                        result(False, f"{where}: no way to run a {kind} block")
                        continue
                    try:
                        r = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, timeout=300)
                        ok, out = r.returncode == 0, r.stdout + r.stderr
                    except subprocess.TimeoutExpired as e:
                        ok, out = False, f"timed out after 300 s\n{e.stdout or ''}{e.stderr or ''}"
                    result(ok, where)
                    if not ok:
                        print("    " + out.strip().replace("\n", "\n    "))
                if daemon.poll() is not None:
                    result(False, f"shmrefd exited ({daemon.returncode}) during {name}")
                    break
        finally:
            daemon.terminate()
            daemon.wait()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
