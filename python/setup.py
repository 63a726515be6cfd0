# SPDX-License-Identifier: MIT
"""Builds shmref._shmref, the C extension over libshmref.

Where libshmref comes from (SHMREF_LIBRARY):
  bundled (default): libshmref's own sources in this repository (../client-lib, ../proto)
      are compiled into the extension, with their symbols hidden; the only system
      dependency is msgpack-c (Debian: libmsgpack-dev), found with pkg-config. Nothing to
      install first: `pip install ./python` from a checkout.
  system: link the installed libshmref.so found by `pkg-config shmref` (after
      `cmake --install`); the extension then uses the system library at run time.
"""
import os
import shlex
import subprocess
from pathlib import Path

import numpy
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class BuildAlways(build_ext):
    """Rebuilds every time: pip builds in this directory, and a build/ left by an earlier
    run (another SHMREF_LIBRARY, a changed header) must not be taken as up to date."""

    def finalize_options(self):
        super().finalize_options()
        self.force = True

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def pkg_config(*args):
    try:
        out = subprocess.run(["pkg-config", *args], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"shmref: pkg-config {' '.join(args)} failed ({e}); on Debian: "
                         "apt-get install pkg-config libmsgpack-dev") from e
    return shlex.split(out)


def flags(pkg):
    cflags, libs = pkg_config("--cflags", pkg), pkg_config("--libs", pkg)
    return ([f[2:] for f in cflags if f.startswith("-I")],
            [f[2:] for f in libs if f.startswith("-L")],
            [f[2:] for f in libs if f.startswith("-l")])


mode = os.environ.get("SHMREF_LIBRARY", "bundled")
sources = sorted(str(p.relative_to(HERE)) for p in (HERE / "src").glob("*.c"))
include_dirs = ["src", numpy.get_include()]
library_dirs, libraries, link_args = [], [], []
if mode == "bundled":
    lib_sources = sorted((ROOT / "client-lib").glob("*.c")) + sorted((ROOT / "proto").glob("*.c"))
    if not lib_sources:
        raise SystemExit(f"shmref: libshmref's sources not found under {ROOT}: build from a checkout "
                         "of the shmrefd repository, or set SHMREF_LIBRARY=system")
    sources += [os.path.relpath(p, HERE) for p in lib_sources]
    include_dirs += [str(ROOT / "client-lib" / "include"), str(ROOT / "client-lib"), str(ROOT / "proto")]
    inc, ldirs, libs = flags("msgpack")
    include_dirs += inc
    library_dirs += ldirs
    libraries += libs
    # Only the module's init function is exported; libshmref's copy stays private.
    link_args.append(f"-Wl,--version-script={HERE / 'src' / 'extension.map'}")
elif mode == "system":
    inc, ldirs, libs = flags("shmref")
    include_dirs += inc
    library_dirs += ldirs
    libraries += libs
    link_args += [f"-Wl,-rpath,{d}" for d in ldirs]
else:
    raise SystemExit(f"shmref: SHMREF_LIBRARY must be 'bundled' or 'system', not {mode!r}")

setup(cmdclass={"build_ext": BuildAlways}, ext_modules=[Extension(
    "shmref._shmref",
    sources=sources,
    include_dirs=include_dirs,
    library_dirs=library_dirs,
    libraries=libraries,
    define_macros=[("_GNU_SOURCE", None), ("NPY_NO_DEPRECATED_API", "NPY_1_25_API_VERSION")],
    extra_compile_args=["-std=gnu11", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-missing-field-initializers",
                        "-Wno-unused-parameter", "-Wno-cast-function-type"],
    extra_link_args=link_args,
)])
