# SPDX-License-Identifier: MIT
"""Python overhead of acquire + release against the same calls from C (issue 9's target:
at most 2x). Starts this build's shmrefd on a temporary socket, publishes one array, then
times N acquire+release pairs from a C program (built here against this build's
libshmref) and from Python (``a = c.acquire(ref); c.release(a); del a``), on one
connection each, and prints microseconds per pair and the ratio.

Usage: python overhead.py BUILD_DIR [N]   (BUILD_DIR: the CMake build, e.g. build)
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

import shmref

C_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <shmref/shmref.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(int argc, char **argv) {
    shmref_conn *c; shmref_desc d; shmref_buf *b; shmref_meta_array m;
    int n = atoi(argv[3]), with_meta = atoi(argv[4]);
    if (shmref_connect(argv[1], &c) < 0 || shmref_desc_from_text(argv[2], &d) < 0) return 1;
    for (int i = 0; i < n / 10; i++) { shmref_acquire(c, &d, &b); shmref_release(b); } /* warm */
    double t0 = now();
    for (int i = 0; i < n; i++) {
        if (shmref_acquire(c, &d, &b) < 0) { fprintf(stderr, "%s\n", shmref_errmsg(c)); return 1; }
        if (with_meta && shmref_buf_meta_array(b, &m) < 0) return 2;
        shmref_release(b);
    }
    printf("%.3f\n", (now() - t0) / n * 1e6);
    shmref_close(c);
    return 0;
}
"""


def main():
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tmp = tempfile.mkdtemp(prefix="shmref-overhead-")
    sock = os.path.join(tmp, "s.sock")
    daemon = subprocess.Popen([os.path.join(build, "bin", "shmrefd"), "--socket", sock],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        exe = os.path.join(tmp, "overhead-c")
        with open(exe + ".c", "w") as f:
            f.write(C_SOURCE)
        subprocess.run(["cc", "-O2", "-o", exe, exe + ".c", "-I", os.path.join(root, "client-lib", "include"),
                        "-L", os.path.join(build, "lib"), "-lshmref", "-Wl,-rpath," + os.path.join(build, "lib")],
                       check=True)
        for _ in range(200):
            try:
                c = shmref.connect(sock)
                break
            except OSError:
                time.sleep(0.02)
        for size in (1000, 1_000_000):
            a = c.empty(size, "float64")
            a[:] = 1
            ref = c.publish(a)
            rows = {}
            for label, meta in (("C acquire+release", 0), ("C acquire+meta+release", 1)):
                runs = [float(subprocess.run([exe, sock, str(ref), str(n), str(meta)], check=True,
                                             capture_output=True, text=True).stdout) for _ in range(3)]
                rows[label] = min(runs)
            with shmref.connect(sock) as pc:
                for _ in range(n // 10):
                    x = pc.acquire(ref)
                    pc.release(x)
                    del x
                best = None
                for _ in range(3):
                    t0 = time.perf_counter()
                    for _ in range(n):
                        x = pc.acquire(ref)
                        pc.release(x)
                        del x
                    us = (time.perf_counter() - t0) / n * 1e6
                    best = us if best is None else min(best, us)
            rows["Python acquire+release"] = best
            print(f"float64 x {size} ({size * 8} bytes), {n} pairs, best of 3:")
            for k, v in rows.items():
                print(f"  {k:26s} {v:8.2f} us")
            print(f"  ratio Python / C          {best / rows['C acquire+release']:8.2f}x"
                  f"   (vs C with metadata decode: {best / rows['C acquire+meta+release']:.2f}x)")
            del a
        c.close()
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
