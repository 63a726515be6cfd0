# SPDX-License-Identifier: MIT
"""shmref: numpy (and torch) arrays zero-copy between processes through shmrefd.

A producer writes into a lease and publishes it; any process that gets the descriptor
(a :class:`Ref`, text ``shmref1:<token>:<size>``) acquires a read-only, zero-copy view::

    import shmref
    with shmref.connect() as c:
        a = c.empty((1000, 1000), "float64")
        a[:] = 1.0
        ref = c.publish(a, keep=10.0)          # str(ref) -> "shmref1:..."
        with c.acquire(ref) as b:               # read-only, same dtype and shape
            print(b.sum())                      # released at the end of the block

Publishing makes the buffer read-only for every view. Arrays keep their mapping while
any view exists, even after ``Client.close()``; ``Client.release(a)`` (or the end of a
``with`` block over ``a``) gives it up at once, or raises ``BufferError`` while a view
still uses it. Durations are float seconds; the daemon's refusals are OSError
subclasses (:class:`QuotaExceeded`, :class:`PoolFull`, :class:`LimitReached`).

Pickling: ``multiprocessing`` (and ``concurrent.futures.ProcessPoolExecutor``, torch's
DataLoader workers) pass arrays that live in shmref by reference (:func:`shared` makes
any array such an array), as do pickles made inside ``with shmref.by_reference():``;
any other pickle (``pickle.dump`` to a file) holds the bytes. A by-reference pickle
names no socket: the receiver acquires through its own default client. :func:`encode` and
:func:`decode` turn nested dicts and lists holding arrays into tesseract-core's array
JSON, with the ``"shmref"`` encoding for large arrays and ``"base64"`` for small ones.

Arrow: :meth:`Client.publish_batch` copies any Arrow data (the PyCapsule interface:
pyarrow, polars, duckdb, nanoarrow) once into one lease; :meth:`Client.acquire_batch`
returns a :class:`Batch` that pyarrow, polars, duckdb, nanoarrow and daft read zero-copy.
:mod:`shmref.flight` serves units to other machines through Arrow Flight.
"""
from __future__ import annotations

import base64 as _base64
import binascii as _binascii
import errno as _errno
import math as _math
import os as _os
import threading as _threading
import contextlib as _contextlib
import contextvars as _contextvars
import multiprocessing.reduction as _mp_reduction
from typing import Any, Iterator, Optional

import numpy as _np

from . import _shmref
from ._shmref import Batch, Buffer, Client, Ref, default_socket, meta_decode, meta_encode

from ._shmref import LimitReached, PoolFull, QuotaExceeded, Refused

__all__ = [
    "Batch", "Buffer", "Client", "Ref", "SharedArray", "connect", "default_client", "shared", "encode", "decode",
    "metadata", "by_reference", "meta_encode", "meta_decode", "default_socket", "INLINE_MAX", "PICKLE_KEEP",
    "ENCODE_KEEP", "Refused", "QuotaExceeded", "PoolFull", "LimitReached",
]
__version__ = "0.1.0"

#: Arrays of at most this many bytes are inlined by :func:`encode` as base64 (no daemon
#: round trip); larger ones go through shmref.
INLINE_MAX = 64 * 1024
#: Retention (seconds) of a buffer that a by-reference pickle publishes, so the pickle
#: stays good after the sender drops its array: it ends at the first acquire (one
#: receiver), or after this time if nobody acquires.
PICKLE_KEEP = 60.0
#: Retention (seconds) of the buffers :func:`encode` publishes: the JSON's only holder
#: until the decoder acquires; the first acquire ends it.
ENCODE_KEEP = 60.0
_DEPRECATED = {"PICKLE_KEEP_MS": ("PICKLE_KEEP", 60_000), "ENCODE_KEEP_MS": ("ENCODE_KEEP", 60_000)}


def __getattr__(name: str) -> Any:
    """The first API's millisecond constants, with a DeprecationWarning."""
    if name in _DEPRECATED:
        import warnings
        new, value = _DEPRECATED[name]
        warnings.warn(f"shmref.{name} is deprecated: use shmref.{new} (seconds)", DeprecationWarning, stacklevel=2)
        return value
    raise AttributeError(f"module 'shmref' has no attribute {name!r}")


def connect(socket: Optional[str] = None, *, timeout: Optional[float] = None) -> Client:
    """Connects to shmrefd and returns a :class:`Client` (a context manager).

    socket: the daemon's socket path; None follows the C library's rule
    (``$SHMREFD_SOCKET``, else ``$XDG_RUNTIME_DIR/shmrefd.sock``, else
    ``/run/shmrefd/shmrefd.sock``). timeout: seconds that connecting and every later call
    may wait for the daemon (``math.inf``: no limit); None takes ``$SHMREF_TIMEOUT_MS``,
    else 30 s. A daemon that is absent fails at once (``FileNotFoundError`` or
    ``ConnectionRefusedError`` naming the socket); one that does not answer raises
    ``TimeoutError`` after the timeout.
    """
    return Client(socket, timeout)


_by_reference: "_contextvars.ContextVar[bool]" = _contextvars.ContextVar("shmref_by_reference", default=False)


@_contextlib.contextmanager
def by_reference() -> Iterator[None]:
    """Within this block (this thread or task), every pickle of an array that lives in
    shmref holds its descriptor instead of its bytes, as ``multiprocessing``'s pickles
    always do. Use it only for pickles a process of this machine unpickles while the
    buffer lives (the sender holds the array, or within :data:`PICKLE_KEEP` for one
    receiver): a pickle that outlives the buffer cannot be loaded."""
    token = _by_reference.set(True)
    try:
        yield
    finally:
        _by_reference.reset(token)


class SharedArray(_np.ndarray):
    """The ndarray subclass of arrays that live in shmref (from ``empty``, ``acquire``,
    :func:`shared`). It behaves as a plain ndarray, and differs in two ways.

    Pickling: through ``multiprocessing`` (its ForkingPickler: Pool, Queue, Process
    arguments, ``ProcessPoolExecutor``) or inside :func:`by_reference`, an array backed
    by a shmref buffer pickles as its descriptor and layout (a few dozen bytes), and the
    receiving process acquires the same memory through its own default client (the pickle
    names no socket). Pickling a lease not yet published publishes it, retained
    :data:`PICKLE_KEEP` seconds for one receiver, and makes it read-only for every view.
    Any other pickle (``pickle.dumps``, ``pickle.dump`` to a file) holds the bytes, so it
    loads anywhere, any time. Results of arithmetic on it are plain ndarrays.

    ``with`` block: ``with c.acquire(ref) as b:`` (or over ``c.empty(...)``) gives the
    buffer up at the end of the block, as ``Client.release`` does: ``BufferError`` if a view
    of it is still alive then."""

    def __array_wrap__(self, obj, context=None, return_scalar=False):
        if return_scalar:
            return obj[()]
        return obj

    def __reduce_ex__(self, protocol):
        if _by_reference.get():
            return _reduce_by_reference(self)
        return _np.asarray(self).view(_np.ndarray).__reduce_ex__(protocol)

    def __reduce__(self):
        return self.__reduce_ex__(2)

    def __enter__(self) -> "SharedArray":
        return self

    def __exit__(self, *exc: object) -> None:
        # References here: the with statement's name, its bound __exit__, this frame's
        # self and the call's argument; any more is a view (BufferError).
        _shmref._release_array(self, 4)


def _reduce_by_reference(a: SharedArray) -> tuple:
    info = _shmref._buffer_info(a)
    dt = a.dtype
    if info is None or dt.hasobject or dt.fields is not None or dt.subdtype is not None:
        return _np.asarray(a).view(_np.ndarray).__reduce__()
    ref = info["ref"]
    if ref is None:  # a lease nobody published yet: publish it, retained for one receiver
        _shmref._freeze(a)  # read-only for this view and the arrays it views, then the mapping
        ref = _shmref._publish_buffer(info["buffer"], PICKLE_KEEP)
    return (_rebuild, (str(ref), dt.str, a.shape, a.strides, info["offset"]))


# multiprocessing's pickles (and only those) carry shmref arrays by reference, as
# torch.multiprocessing registers its tensors' reducers.
_mp_reduction.ForkingPickler.register(SharedArray, _reduce_by_reference)

_shmref._set_array_type(SharedArray)

_defaults: dict = {}
_defaults_lock = _threading.Lock()


def _after_fork_in_child() -> None:
    global _defaults_lock
    _shmref._after_fork_child()  # every inherited connection is closed for this process
    _defaults_lock = _threading.Lock()
    _defaults.clear()


_os.register_at_fork(after_in_child=_after_fork_in_child)


def _default_key(socket) -> tuple:
    # A path given is the caller's choice; none follows connect()'s rule (the default
    # socket, and a private daemon when none answers there), per default path.
    pid = _os.getpid()
    return (pid, socket) if socket else (pid, None, default_socket())


def default_client(socket: Optional[str] = None) -> Client:
    """This process's own client for socket (default: what :func:`connect` with no
    socket finds: the C library's default socket, else the private daemon it starts),
    made on first use and again in a forked child; unpickling, :func:`shared`,
    :func:`encode` and :func:`decode` use it when given no client. Do not close it."""
    key = _default_key(socket)
    with _defaults_lock:
        c = _defaults.get(key)
        if c is None or c.closed:
            # Not connect(default_socket()): a path named turns the private daemon off.
            c = _defaults[key] = connect(socket or None)
        return c


def _unusable(e: OSError) -> bool:
    # A lease's wait= that ran out (its TimeoutError has .wait) leaves the connection fine.
    if getattr(e, "wait", None):
        return False
    return isinstance(e, (ConnectionError, TimeoutError)) or e.errno in (_errno.ENOTCONN, _errno.ECONNRESET)


def _have_default(socket) -> bool:
    return _default_key(socket) in _defaults


def _on_default(socket, fn):
    """fn() using the default client, once more on a new connection if the cached one
    turns out dead (the daemon restarted, a timeout abandoned it)."""
    cached = _have_default(socket)
    try:
        return fn()
    except OSError as e:
        if not _unusable(e):
            raise
        _drop_default(socket)
        if not cached:
            raise
    return fn()


def _drop_default(socket) -> None:
    with _defaults_lock:
        c = _defaults.pop(_default_key(socket), None)
    if c is not None:
        c.close()


_default_client = default_client  # kept for code written against the first commit


def _rebuild(text, dtype, shape, strides, offset, *ignored):
    """Unpickles a by-reference array through this process's default client. Whatever
    else the pickle says (pickles of the first releases named the sender's socket) is
    not followed: a pickle does not choose the daemon a process trusts."""
    return _on_default(None, lambda: default_client()._acquire_view(text, dtype, shape, strides, offset))


def shared(array: Any, *, client: Optional[Client] = None, keep: Optional[float] = None,
           keep_ms: Optional[int] = None, wait: Optional[float] = None) -> SharedArray:
    """Returns an array that ``multiprocessing`` pickles by reference: the array itself if
    it already lives in shmref, else a read-only copy in a new buffer. The copy is not
    published yet: its buffer goes back as soon as the array (and every view) is gone, so
    a loop of ``shared`` holds one buffer per live array, never more. The first
    by-reference pickle publishes it, retained :data:`PICKLE_KEEP` seconds for one receiver (the first acquire ends the retention): a
    descriptor pickled from it must be unpickled while the sender still holds the array,
    or by one receiver within that time. client: default, this process's connection to
    the default socket. A keep given publishes the copy at once with that retention
    (for one receiver). keep_ms is a deprecated alias of keep (milliseconds). wait (float
    seconds): as for :meth:`Client.empty`, how long the copy's lease may wait for quota or
    pool space (None or 0: not at all)."""
    if _shmref._buffer_info(array) is not None:
        return array
    src = _np.asarray(array)
    if keep_ms is not None:
        import warnings
        warnings.warn("shared(keep_ms=) is deprecated: keep= in seconds", DeprecationWarning, stacklevel=2)
        keep = keep_ms / 1000.0

    def copy():
        c = client if client is not None else default_client()
        dst = c.empty(src.shape, src.dtype, wait=wait)
        _np.copyto(dst, src)
        if keep is None:
            _shmref._freeze(dst)
        else:  # asked for: published now, retained keep seconds for one receiver
            c.publish(dst, keep=keep, max_acquires=1)
        return dst

    return copy() if client is not None else _on_default(None, copy)


def metadata(array: Any) -> Optional[bytes]:
    """The user metadata (``meta=`` at publish) of an array from shmref, or None. A
    producer's non-shmref metadata (another convention) is returned whole."""
    info = _shmref._buffer_info(array)
    return None if info is None else info["user"]


try:  # SIMD base64, as tesseract-core uses; the standard library's is 5-10x slower
    import pybase64 as _pybase64

    def _b64encode(a: _np.ndarray) -> str:
        return _pybase64.b64encode_as_string(a.data if a.flags.c_contiguous else a.tobytes())

    def _b64decode(text: str) -> bytes:
        return _pybase64.b64decode(text, validate=True)
except ImportError:  # pragma: no cover - pybase64 is optional
    def _b64encode(a: _np.ndarray) -> str:
        return _binascii.b2a_base64(a.data if a.flags.c_contiguous else a.tobytes(), newline=False).decode("ascii")

    def _b64decode(text: str) -> bytes:
        return _base64.b64decode(text, validate=True)  # binascii's strict_mode is 3.11+

_json_names: dict = {}   # _np.dtype -> its name in tesseract's array JSON
_json_dtypes: dict = {}  # that name -> the little-endian _np.dtype the bytes are read as


def _json_dtype(dt: _np.dtype) -> str:
    name = _json_names.get(dt)
    if name is None:
        name = dt.name if dt.kind not in "SUV" else dt.str.lstrip("<>|=")
        if len(_json_names) < 256:
            _json_names[dt] = name
    return name


def _dtype_of_json(name: str) -> tuple:
    """(dtype as named, the little-endian dtype its inline bytes are), cached."""
    got = _json_dtypes.get(name)
    if got is None:
        dt = _np.dtype(name)
        got = (dt, dt.newbyteorder("<") if dt.byteorder not in "|<" else dt)
        if len(_json_dtypes) < 256:
            _json_dtypes[name] = got
    return got


def _encode_array(a: _np.ndarray, client, inline_max: int, keep: float) -> dict:
    if a.dtype.hasobject or a.dtype.fields is not None:
        raise TypeError(f"dtype {a.dtype} cannot be encoded")
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    out = {"object_type": "array", "shape": list(a.shape), "dtype": _json_dtype(a.dtype)}
    if a.nbytes <= inline_max:
        out["data"] = {"buffer": _b64encode(a), "encoding": "base64"}
        return out
    c = client if client is not None else default_client()
    info = _shmref._buffer_info(a)
    if info is not None and info["ref"] is not None and info["offset"] == 0 and a.flags.c_contiguous \
            and info["socket"] == c.socket and a.nbytes == info["size"]:
        ref = info["ref"]  # already published or acquired, whole: zero-copy, held by its owner
    else:
        ref = c.share(a, keep=keep, max_acquires=1)
        c.release(ref)  # the retention holds it until the decoder's acquire ends it
    out["data"] = {"buffer": str(ref), "encoding": "shmref"}
    return out


def encode(obj: Any, client: Optional[Client] = None, *, inline_max: Optional[int] = None,
           keep: Optional[float] = None, keep_ms: Optional[int] = None) -> Any:
    """Walks dicts, lists and tuples and returns the same structure with every numpy array
    (or torch CPU tensor) replaced by tesseract-core's array JSON::

        {"object_type": "array", "shape": [...], "dtype": "float64",
         "data": {"buffer": "shmref1:...", "encoding": "shmref"}}

    Arrays of at most ``inline_max`` bytes (default :data:`INLINE_MAX`) are inlined with
    tesseract's ``"base64"`` encoding instead. Large arrays are copied once into a buffer
    published with ``keep`` seconds of retention (default :data:`ENCODE_KEEP`) and nobody
    else holding it, for one consumer (max_acquires 1): the decoder's acquire takes it
    over and ends the retention, and the buffer goes back when the decoded array is gone.
    So decode each reference once, within the retention; a loop of encode/decode holds no
    more than the arrays alive. The result is JSON-serialisable (tuples stay tuples).
    keep_ms is a deprecated alias of keep (milliseconds)."""
    im = INLINE_MAX if inline_max is None else inline_max
    if keep_ms is not None:
        import warnings
        warnings.warn("encode(keep_ms=) is deprecated: keep= in seconds", DeprecationWarning, stacklevel=2)
        keep = keep_ms / 1000.0
    km = ENCODE_KEEP if keep is None else keep

    def walk(x):
        if isinstance(x, _np.ndarray):
            return _encode_array(x, client, im, km)
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, tuple):
            return tuple(walk(v) for v in x)
        if type(x).__module__.startswith("torch") and hasattr(x, "numpy"):
            return _encode_array(x.detach().cpu().numpy(), client, im, km)
        if isinstance(x, _np.generic):
            return x.item()
        return x

    return walk(obj) if client is not None else _on_default(None, lambda: walk(obj))


def _decode_array(d: dict, client) -> _np.ndarray:
    data = d.get("data")
    if not isinstance(data, dict):
        raise ValueError("array JSON without a 'data' object")
    (dtype, le), shape, enc = _dtype_of_json(d["dtype"]), tuple(d["shape"]), data.get("encoding")
    if enc == "base64":  # read-only over the decoded bytes, like the arrays of "shmref"
        return _np.frombuffer(_b64decode(data["buffer"]), dtype=le).reshape(shape)
    if enc == "json":
        return _np.asarray(data["buffer"], dtype=dtype).reshape(shape)
    if enc == "shmref":
        c = client if client is not None else default_client()
        a = c.acquire(data["buffer"])
        if a.dtype != dtype or a.shape != shape:
            if a.nbytes != dtype.itemsize * _math.prod(shape):
                raise ValueError(f"{data['buffer']}: holds {a.dtype} {a.shape}, the JSON says {dtype} {shape}")
            a = _np.ascontiguousarray(a).view(dtype).reshape(shape) if a.size else a.view(dtype).reshape(shape)
        return a
    raise ValueError(f"unsupported array encoding {enc!r} (base64, json and shmref are)")


def decode(obj: Any, client: Optional[Client] = None) -> Any:
    """The inverse of :func:`encode`: walks dicts, lists and tuples and turns every array
    JSON object (encodings ``shmref``, ``base64`` and ``json``) into a numpy array:
    zero-copy for ``shmref`` (acquired through client, default this process's
    connection), over the decoded bytes for ``base64``; read-only for both (``json``
    gives a fresh writable array)."""

    def walk(x):
        if isinstance(x, dict):
            if x.get("object_type") == "array" and "data" in x:
                return _decode_array(x, client)
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        if isinstance(x, tuple):
            return tuple(walk(v) for v in x)
        return x

    return walk(obj) if client is not None else _on_default(None, lambda: walk(obj))


del annotations, Any, Iterator, Optional
