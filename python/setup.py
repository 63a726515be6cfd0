# SPDX-License-Identifier: MIT
"""Debian's build of shmref._shmref (pybuild, debian/rules): the extension linked to the
libshmref installed by the cmake build (SHMREF_LIBRARY=system, found by `pkg-config
shmref`), with Debian's python3-numpy. pip does not use this file: pyproject.toml's
backend (scikit-build-core, CMakeLists.txt) builds wheels and sdists for everyone else.

SHMREF_RPATH=0: no RPATH (the library is in the loader's search path).

The numpy the extension is compiled against decides its numpy requirement: numpy 2.x
headers give an extension that runs with numpy >= 1.25; numpy 1.x headers (Debian 12's
python3-numpy 1.24) one that runs with that 1.x and later 1.x, not with numpy 2.
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
        if isinstance(e, OSError):
            raise SystemExit(f"shmref: pkg-config cannot run ({e}); on Debian: apt-get install pkg-config") from e
        what = ("no shmref.pc (libshmref's pkg-config file): install libshmref (Debian: libshmref-dev; "
                "from a checkout: cmake --install) and set PKG_CONFIG_PATH for its prefix" if args[-1] == "shmref"
                else "on Debian: apt-get install pkg-config libmsgpack-dev")
        raise SystemExit(f"shmref: pkg-config {' '.join(args)} failed: {what}") from e
    return shlex.split(out)


def flags(pkg):
    cflags, libs = pkg_config("--cflags", pkg), pkg_config("--libs", pkg)
    return ([f[2:] for f in cflags if f.startswith("-I")],
            [f[2:] for f in libs if f.startswith("-L")],
            [f[2:] for f in libs if f.startswith("-l")])


NUMPY_MAJOR, NUMPY_MINOR = (int(x) for x in numpy.__version__.split(".")[:2])
# (pyproject.toml's dependencies say numpy>=1.25: the wheels' requirement; Debian's
# package depends on its own python3-numpy.)
api = "NPY_1_25_API_VERSION" if NUMPY_MAJOR >= 2 else "NPY_1_7_API_VERSION"

mode = os.environ.get("SHMREF_LIBRARY", "system")
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
    if os.environ.get("SHMREF_RPATH", "1") != "0":
        link_args += [f"-Wl,-rpath,{d}" for d in ldirs]
else:
    raise SystemExit(f"shmref: SHMREF_LIBRARY must be 'bundled' or 'system', not {mode!r}")

setup(cmdclass={"build_ext": BuildAlways}, ext_modules=[Extension(
    "shmref._shmref",
    sources=sources,
    include_dirs=include_dirs,
    library_dirs=library_dirs,
    libraries=libraries,
    define_macros=[("_GNU_SOURCE", None), ("NPY_NO_DEPRECATED_API", api)],
    extra_compile_args=["-std=gnu11", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-missing-field-initializers",
                        "-Wno-unused-parameter", "-Wno-cast-function-type"],
    extra_link_args=link_args,
)])
