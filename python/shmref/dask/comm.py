# SPDX-License-Identifier: MIT
"""The comm of ``shmref://``: Dask's TCP comm whose large frames to a peer that reaches the
same shmrefd travel as descriptors (see the package's docstring)."""
from __future__ import annotations

import bisect
import errno
import logging
import os
import struct
import sys
import threading
import weakref

import msgpack
import numpy as np
from tornado.iostream import StreamClosedError

import dask
from dask.utils import parse_bytes, parse_timedelta
from distributed.comm.addressing import get_address_host
from distributed.comm.core import Comm, CommClosedError
from distributed.comm.tcp import (
    TCP,
    TLS,
    C_INT_MAX,
    TCPBackend,
    TCPConnector,
    TCPListener,
    TLSBackend,
    TLSConnector,
    TLSListener,
    _add_frames_header,
    convert_stream_closed_error,
    read_bytes_rw,
)
from distributed.comm.utils import from_frames, to_frames
from distributed.protocol.utils import unpack_frames
from distributed.utils import ensure_memoryview, get_ip, nbytes, offload
from tlz import sliding_window

import shmref
from shmref import _shmref

logger = logging.getLogger("distributed.comm.shmref")

SHMREF = "shmref://"
#: The same over TLS: distributed's tls:// comm (its Security objects, certificates and
#: require_encryption) with frames by reference (issue 27, item 4).
SHMREF_TLS = "shmref+tls://"
#: Marker frame version; the first frame of every message on a shmref comm is
#: msgpack [MARK_VERSION, ack, [[index, descriptor, offset, nbytes], ...]]. ack (the
#: peer's messages read) is still sent, for peers before retain, and no longer read.
MARK_VERSION = 1
#: The most daemon work a message does on the event loop (issue 27, item 5): one frame by
#: reference of less than this many bytes, i.e. one lease (or acquire, or retain) round
#: trip and a copy of under 1 MiB. A message with more goes to Dask's offload thread, so
#: that no daemon call holds the worker's event loop for long.
_INLINE_BYTES = 1 << 20


def _on_loop(sizes: list) -> bool:
    """Whether the frames by reference of sizes may be handled on the event loop."""
    return len(sizes) <= 1 and sum(sizes) < _INLINE_BYTES
#: Sharding (distributed.comm.shard) exists for TCP's sake; a frame that goes by reference
#: stays whole, so the receiver gets one mapping (merge_memoryviews needs no copy).
_NO_SPLIT = 1 << 62

#: Why frames fell back to TCP in this process ((exception type, errno) pairs already
#: warned about): each reason is said once, loudly; every fallback is counted
#: (stats()["fallbacks"]) and the later ones of a reason are logged at debug level.
_fallbacks_warned: set = set()


def _fell_back(frames: int, nbytes: int, e: OSError) -> None:
    """frames (nbytes in all) of a message go over TCP because their lease failed with e."""
    _stats.add(fallbacks=1, sent_large_tcp=frames)
    reason = (type(e).__name__, e.errno)
    if reason in _fallbacks_warned:
        logger.debug("shmref: %d frame(s) of %d bytes go over TCP: %s", frames, nbytes, e)
        return
    _fallbacks_warned.add(reason)
    logger.warning("shmref: %d frame(s) of %d bytes go over TCP: %s (said once per reason in this process: "
                   "later fallbacks are counted in shmref.dask.stats()['fallbacks'] and logged at debug level)",
                   frames, nbytes, e)


#: The config section's defaults (distributed.comm.shmref.*), which the package also adds
#: to dask's defaults at import.
DEFAULTS = {"threshold": "64 KiB", "socket": None, "retention": "60s", "enabled": True, "writable": True}


def _config():
    # Every read has its default: a program that resets dask's config after import (as
    # distributed's test harness restores a snapshot taken before shmref.dask added its
    # defaults) has no section, or a partial one (issue 27).
    c = dask.config.get("distributed.comm.shmref", default=None) or {}

    def get(key):
        v = c.get(key)
        return DEFAULTS[key] if v is None else v

    threshold = get("threshold")
    threshold = parse_bytes(threshold) if isinstance(threshold, str) else int(threshold)
    keep = parse_timedelta(get("retention"), default="seconds")
    # keep: float seconds, as the binding takes it (at least a millisecond: 0 would mean
    # no retention, and a frame nobody holds would be gone before its receiver's acquire).
    return (bool(get("enabled")), max(1, threshold), get("socket") or None, max(0.001, float(keep)),
            _boolean(get("writable")))


def _boolean(v) -> bool:
    """A config value as a bool ("false" from a DASK_* variable is parsed by dask already;
    a string that is left is taken as YAML would)."""
    if isinstance(v, str):
        return v.strip().lower() not in ("false", "no", "off", "0", "")
    return bool(v)


class _Stats:
    """This process's counters (tests and the benchmark read them with client.run)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        self.sent_by_ref = self.sent_forwarded = self.sent_bytes_by_ref = 0
        self.sent_copied_bytes = self.sent_large_tcp = self.received_by_ref = 0
        self.received_bytes_by_ref = self.fallbacks = self.comms_by_ref = self.comms_tcp = 0
        # frames its sender had writable that arrived as private copy-on-write mappings (no
        # copy), and those copied instead (the daemon does not know private acquires)
        self.received_private = self.received_copied = 0
        # frames found in a mapping this process acquired that were copied instead of
        # forwarded (the daemon could not retain them for the reader: _retain)
        self.forwards_copied = 0
        # messages whose frames by reference were handled on the event loop (one small
        # frame) and on Dask's offload thread (the rest: _on_loop)
        self.refs_on_loop = self.refs_offloaded = 0
        # frames Dask's serializers wrote straight into a lease (shmref.dask.serialize: Arrow
        # tables and record batches), sent with no copy
        self.sent_serialized = 0
        # messages whose frames to copy were leased in one batch (Client.empty_many)
        self.lease_batches = 0

    def add(self, **kw):
        with self.lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    def as_dict(self):
        with self.lock:
            return {k: v for k, v in vars(self).items() if k != "lock"}


_stats = _Stats()


def stats(reset: bool = False) -> dict:
    """This process's shmref.dask counters and its connection: {"mode": "shmref"|"tcp",
    "socket", "identity", counters...}. reset: zero the counters after reading them."""
    st = _state()
    out = {"mode": "shmref" if st.client is not None else "tcp", "socket": st.socket,
           "identity": st.identity, "pid": os.getpid(), **_stats.as_dict()}
    if reset:
        with _stats.lock:
            _stats.reset()
    return out


class _State:
    """This process's connection to shmrefd (made once; again after fork), its identity,
    and the mappings it acquired (address -> descriptor), for forwarding."""

    def __init__(self):
        self.pid = os.getpid()
        self.lock = threading.Lock()
        enabled, self.threshold, sock, self.keep, self.writable = _config()
        self.socket = sock or shmref.default_socket()  # until connected: where it looks
        self.client = None
        self.identity = None
        self.private = True      # until the daemon says it does not know private acquires
        self.retain = True       # until the daemon says it does not know retain requests
        self.starts: list = []   # sorted start addresses of live mappings
        self.maps: dict = {}     # start -> (end, descriptor text)
        if not enabled:
            logger.info("shmref: distributed.comm.shmref.enabled is false: frames travel over TCP")
            return
        try:
            # A socket configured is a choice; none follows shmref.connect()'s rule (the
            # default socket, else the private daemon libshmref starts), as every entry
            # point does: naming the default path would turn the private daemon off.
            self.client = shmref.connect(sock, timeout=10)
            self.socket = self.client.socket  # the one that answered (libshmref's rule)
            # No lease stock: frames come in every size, so a stock would keep up to 4
            # classes x 2 leases (of up to 16 MiB each) per process leased and charged
            # after the transfers are done; a frame's lease is one round trip without it.
            self.client.set_stock(0)
            self.identity = _identity(self.client, self.socket)
        except OSError as e:
            self.client = None
            logger.warning("shmref: no shmrefd reachable at %s (%s): frames travel over TCP", self.socket, e)
            return
        logger.info("shmref: frames of at least %d bytes to peers of shmrefd %s (pid %d) go by reference",
                    self.threshold, self.socket, self.client.daemon_pid)

    def add_mapping(self, arr, text, published=False):
        """arr maps the buffer text names. published: arr is a lease this process published
        for one reader (shmref.dask.serialize's frames): its first send needs no retain."""
        start = arr.__array_interface__["data"][0]
        with self.lock:
            if start not in self.maps:
                bisect.insort(self.starts, start)
            self.maps[start] = [start + arr.nbytes, text, published]
        weakref.finalize(arr, self._drop_mapping, start, text)

    def _drop_mapping(self, start, text):
        with self.lock:
            got = self.maps.get(start)
            if got is not None and got[1] == text:
                del self.maps[start]
                i = bisect.bisect_left(self.starts, start)
                if i < len(self.starts) and self.starts[i] == start:
                    del self.starts[i]

    def lookup(self, addr, n):
        """(descriptor, offset, fresh) when [addr, addr+n) lies in a mapping this process
        holds; fresh: a lease it published for one reader, not sent yet (now it is)."""
        with self.lock:
            i = bisect.bisect_right(self.starts, addr) - 1
            if i < 0:
                return None
            start = self.starts[i]
            m = self.maps[start]
            if addr + n <= m[0]:
                fresh, m[2] = m[2], False
                return m[1], addr - start, fresh
        return None


_the_state = None
_state_lock = threading.Lock()


def _state() -> _State:
    global _the_state
    st = _the_state
    if st is None or st.pid != os.getpid():
        with _state_lock:
            st = _the_state
            if st is None or st.pid != os.getpid():
                st = _the_state = _State()
    return st


def _after_fork_in_child():
    global _state_lock, _the_state
    _state_lock = threading.Lock()
    _the_state = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def _identity(client, socket) -> str:
    """Who the daemon is, as both ends of a comm can check: the host's boot id, the
    daemon's pid and start time (/proc/PID/stat) and its socket's device and inode."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    pid = client.daemon_pid
    try:
        with open(f"/proc/{pid}/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        start = "?"  # another pid namespace: the socket's inode still tells the daemon
    st = os.stat(socket)
    return f"{boot}:{pid}:{start}:{st.st_dev}:{st.st_ino}"


def _address(mv: memoryview) -> int:
    return np.frombuffer(mv, dtype=np.uint8).__array_interface__["data"][0]


def _clear_writeable(obj) -> bool:
    """Sets every "writeable" flag in a (decoded) sub-header to False; True if any was."""
    changed = False
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "writeable" and isinstance(v, (list, tuple)):
                if any(v):
                    obj[k] = tuple(False if w else w for w in v)
                    changed = True
            elif isinstance(v, (dict, list, tuple)):
                changed |= _clear_writeable(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            if isinstance(v, (dict, list, tuple)):
                changed |= _clear_writeable(v)
    return changed


def _sub_headers(frame):
    """(offset, decoded sub-header) of each serialized object of a message: Dask's msgpack
    header (frame 0) names them with "__Serialized__". frame(i) gives frame i's bytes (a
    header that came by reference is mapped first)."""
    subs = []

    def hook(obj):
        off = obj.get("__Serialized__", 0)
        if off:
            subs.append(off)
        return obj

    msgpack.loads(frame(0), object_hook=hook, use_list=False, strict_map_key=False, raw=False)
    return [(off, msgpack.loads(frame(off), use_list=False, strict_map_key=False, raw=False)) for off in subs]


def _mark_read_only(frames: list, by_ref: set) -> None:
    """Objects that arrive in mapped (read-only) frames are deserialized read-only: Dask
    would otherwise copy a frame its sender had writable (numpy, the pickle serializer).
    Only with distributed.comm.shmref.writable false: by default Dask's rule stands (an
    object its sender had writable arrives writable, in a private mapping)."""
    for off, sub in _sub_headers(frames.__getitem__):
        n = sub.get("num-sub-frames", 0) if isinstance(sub, dict) else 0
        if any(off < i <= off + n for i in by_ref) and _clear_writeable(sub):
            frames[off] = msgpack.dumps(sub, use_bin_type=True)


def _writable_frames(by_ref: set, frame) -> set:
    """Which of the frames in by_ref their sender had writable (the "writeable" flags of
    the sub-header that precedes them): Dask copies such a frame when it arrives
    read-only, and keeps it when it arrives writable. frame(i) gives frame i's bytes: a
    header that itself came by reference (a message's first frame of 64 KiB or more: a
    graph of thousands of tasks) is mapped first."""
    out = set()
    for off, sub in _sub_headers(frame):
        w = _find_writeable(sub)
        if not w or not isinstance(sub, dict):
            continue
        # The flags name the last sub-frames (pickle's: its buffers, after the pickle
        # itself; numpy's: its one frame); sub-frame k starts at frame off + 1 +
        # split-offsets[k] (shmref never splits a frame it sends by reference).
        n = sub.get("num-sub-frames", len(w))
        starts = sub.get("split-offsets") or range(n)
        shift = n - len(w)
        if shift < 0 or len(starts) < n:
            continue
        out.update(off + 1 + starts[shift + j] for j, flag in enumerate(w)
                   if flag and off + 1 + starts[shift + j] in by_ref)
    return out


def _find_writeable(obj):
    """The first "writeable" flags in a (decoded) sub-header, where Dask's serializers put
    them (the header itself, or its "sub-header"), or None."""
    if isinstance(obj, dict):
        w = obj.get("writeable")
        if isinstance(w, (list, tuple)):
            return w
        for v in obj.values():
            if isinstance(v, dict):
                w = _find_writeable(v)
                if w is not None:
                    return w
    return None


def _acquire_private(st, text: str):
    """A private (copy-on-write) mapping of the buffer text names, writable at no copy
    until written; None when the daemon does not know private acquires (then, and from
    then on in this process, such frames are copied as before: said once)."""
    try:
        return st.client.acquire(text, private=True)
    except OSError as e:
        if e.errno != errno.EOPNOTSUPP:
            raise
        st.private = False
        reason = ("private", e.errno)
        if reason not in _fallbacks_warned:
            _fallbacks_warned.add(reason)
            logger.warning("shmref: frames their sender had writable are copied on arrival: %s (said once per "
                           "reason in this process: counted in shmref.dask.stats()['received_copied'])", e)
        return None


def _retain(st, text: str) -> bool:
    """Gives the buffer text names, which this process holds, one more acquire of
    retention (Client.retain), so that it outlives this process for the reader of the
    message about to carry its descriptor: a forwarded frame is a buffer this process
    acquired, whose publish's retention ended at this process's own acquire, and this
    process may exit (a retiring worker hands its data over and shuts down) before the
    reader acquires it. False when it cannot: the frame is then copied into a lease of its
    own (EOPNOTSUPP, an older shmrefd: from then on in this process, said once; EPERM,
    another uid's buffer: its retention would be that uid's charge; said once per reason)."""
    try:
        st.client.retain(text, keep=st.keep)
        return True
    except OSError as e:
        if e.errno == errno.EOPNOTSUPP:
            st.retain = False
        reason = ("retain", e.errno)
        if reason in _fallbacks_warned:
            logger.debug("shmref: a forwarded frame is copied: %s", e)
        else:
            _fallbacks_warned.add(reason)
            logger.warning("shmref: forwarded frames are copied into fresh leases: %s (said once per reason in "
                           "this process: counted in shmref.dask.stats()['forwards_copied'])", e)
        return False


class ShmrefComm(TCP):
    """A TCP comm whose first frame of each message says which frames travel as
    descriptors. A message written is delivered even if this end closes or its process
    exits right after: a frame copied is its publish's retention's to keep, a frame
    forwarded the retention _to_refs adds before the message goes (_retain)."""

    def __init__(self, *args, **kwargs):
        self._by_ref = False
        # The peer's messages read: sent as the marker's ack, which this end no longer
        # reads, for a peer of MARK_VERSION 1 before retain, which held the frames it
        # forwarded until acknowledged.
        self._nread = 0
        super().__init__(*args, **kwargs)

    # The handshake: both ends say which daemon they reach; frames go by reference only
    # when it is the same one.
    def handshake_info(self):
        info = super().handshake_info()
        st = _state()
        info["shmref"] = st.identity
        return info

    def handshake_configuration(self, local, remote):  # an instance method here, on purpose
        out = Comm.handshake_configuration(local, remote)
        mine, theirs = local.get("shmref"), remote.get("shmref")
        self._by_ref = mine is not None and mine == theirs
        _stats.add(**{"comms_by_ref" if self._by_ref else "comms_tcp": 1})
        out["shmref"] = self._by_ref
        return out

    @property
    def by_ref(self) -> bool:
        """Whether large frames go by reference on this comm (decided by the handshake)."""
        return self._by_ref

    def _to_refs(self, frames: list):
        """(marker entries, frames with the by-reference ones emptied). A frame in a
        mapping this process acquired is forwarded (its descriptor travels) once its buffer
        got one more acquire of retention, one round trip per buffer per message (_retain:
        the reader takes it once, whatever number of frames lie in it). Every frame copied
        gets a lease of its own, so that each is released on its own: the receiver's
        objects of one message (P2P's shards, a list of arrays) do not keep each other
        mapped, as TCP.read gives each frame its own buffer on purpose (issue 27, item 2).
        A frame that cannot get a lease (pool full, daemon gone) stays in the TCP frames."""
        st = _state()
        client = st.client
        entries, out = [], list(frames)
        forwarded = forwards_copied = serialized = 0
        own = []
        retained: dict = {}  # descriptor text -> whether its retention was added
        for i, f in enumerate(frames):
            n = nbytes(f)
            if n < st.threshold or client is None:
                continue
            mv = ensure_memoryview(f)
            hit = st.lookup(_address(mv), n)
            if hit is not None:
                text = hit[0]
                if hit[2]:  # serialized into a lease published for this message's reader
                    retained[text] = True
                    serialized += 1
                elif text not in retained:
                    retained[text] = st.retain and _retain(st, text)
                if retained[text]:
                    entries.append((i, text, hit[1], n))
                    out[i] = b""
                    forwarded += not hit[2]
                    continue
                forwards_copied += 1
            own.append((i, mv, n))
        copied = 0
        # Their leases in one batch (one round trip for up to 32 a message), each frame still
        # its own lease; if the batch is refused (all or nothing), one by one, so that only
        # the frames that cannot get one go over TCP.
        try:
            arrs = client.empty_many([n for _, _, n in own]) if len(own) > 1 else [None] * len(own)
            if len(own) > 1:
                _stats.add(lease_batches=1)
        except OSError:
            arrs = [None] * len(own)
        for k, (i, mv, n) in enumerate(own):
            arr, arrs[k] = arrs[k], None  # this name alone holds it: release() then lets it go
            try:
                if arr is None:
                    arr = client.empty(n, np.uint8)
                np.copyto(arr, np.frombuffer(mv, dtype=np.uint8))
                ref = _shmref._publish_buffer(_shmref._buffer_info(arr)["buffer"], st.keep)
                client.release(arr)  # the retention holds it until the receiver's acquire
                del arr
            except OSError as e:
                _fell_back(1, n, e)
                continue
            entries.append((i, str(ref), 0, n))
            out[i] = b""
            copied += n
        if entries or forwards_copied:
            _stats.add(sent_by_ref=len(entries), sent_forwarded=forwarded, sent_copied_bytes=copied,
                       sent_bytes_by_ref=sum(e[3] for e in entries), forwards_copied=forwards_copied,
                       sent_serialized=serialized)
        return entries, out

    def _from_refs(self, frames: list, entries) -> list:
        st = _state()
        if st.client is None:
            raise CommClosedError(f"in {self}: the peer sent frames by reference and this process has no shmrefd")
        by_ref = {e[0]: e for e in entries}
        mapped = {}  # text -> the plain (shared, read-only) mapping
        mine = {}    # text -> a private mapping, for the frames their sender had writable
        done = set()

        def put(i, arr):
            _, text, off, n = by_ref[i]
            if off + n > arr.nbytes:
                raise CommClosedError(f"in {self}: frame {i} ({off}+{n} bytes) lies outside {text}")
            frames[i] = memoryview(arr).cast("B")[off:off + n]
            done.add(i)

        def plain(i):
            """Frame i, mapped (shared, read-only) if it came by reference."""
            if i in by_ref and i not in done:
                text = by_ref[i][1]
                arr = mapped.get(text)
                if arr is None:
                    arr = mapped[text] = st.client.acquire(text)
                    st.add_mapping(arr, text)
                put(i, arr)
            return frames[i]

        # A frame its sender had writable arrives in a private copy-on-write mapping: Dask
        # keeps it as it is (no copy), and the task's writes stay in this process's pages.
        writable = _writable_frames(set(by_ref), plain) if st.writable and st.private else ()
        copied = 0
        for i, text, off, n in entries:
            if i in done:
                continue  # a header, mapped to be read
            arr = None
            if i in writable:
                arr = mine.get(text)
                if arr is None and st.private:
                    arr = _acquire_private(st, text)
                    if arr is not None:
                        mine[text] = arr  # never forwarded: its bytes may be this process's own
                copied += arr is None
            if arr is None:
                plain(i)
            else:
                put(i, arr)
        _stats.add(received_by_ref=len(entries), received_bytes_by_ref=sum(e[3] for e in entries),
                   received_private=len(writable) - copied if writable else 0, received_copied=copied)
        if not st.writable:
            _mark_read_only(frames, set(by_ref))
        return frames

    async def read(self, deserializers=None):
        stream = self.stream
        if stream is None:
            raise CommClosedError()
        fmt = "Q"
        fmt_size = struct.calcsize(fmt)
        try:
            frames_nosplit_nbytes_bin = await stream.read_bytes(fmt_size)
            (frames_nosplit_nbytes,) = struct.unpack(fmt, frames_nosplit_nbytes_bin)
            frames_nosplit = await read_bytes_rw(stream, frames_nosplit_nbytes)
            frames, buffers_nbytes = unpack_frames(frames_nosplit, partial=True)
            for buffer_nbytes in buffers_nbytes:
                buffer = await read_bytes_rw(stream, buffer_nbytes)
                frames.append(buffer)
        except StreamClosedError as e:
            self.stream = None
            self._closed = True
            convert_stream_closed_error(self, e)
        except BaseException:
            self.abort()
            raise
        try:
            version, _ack, entries = msgpack.loads(frames[0], use_list=False)
            if version != MARK_VERSION:
                raise ValueError(f"marker version {version}, expected {MARK_VERSION}")
            frames = list(frames[1:])
            self._nread += 1
            if entries:
                if _on_loop([e[3] for e in entries]):
                    _stats.add(refs_on_loop=1)
                    frames = self._from_refs(frames, entries)
                else:
                    _stats.add(refs_offloaded=1)
                    frames = await offload(self._from_refs, frames, entries)
        except CommClosedError:
            self.abort()
            raise
        except (OSError, ValueError, TypeError, IndexError) as e:
            self.abort()
            raise CommClosedError(f"in {self}: shmref frames: {e}") from e
        try:
            return await from_frames(frames, deserialize=self.deserialize, deserializers=deserializers,
                                     allow_offload=self.allow_offload)
        except EOFError:
            self.abort()
            raise CommClosedError("aborted stream on truncated data")

    async def write(self, msg, serializers=None, on_error="message"):
        stream = self.stream
        if stream is None:
            raise CommClosedError()
        by_ref = self._by_ref
        frames = await to_frames(
            msg,
            allow_offload=self.allow_offload,
            serializers=serializers,
            on_error=on_error,
            context={"sender": self.local_info, "recipient": self.remote_info, **self.handshake_options},
            frame_split_size=_NO_SPLIT if by_ref else self.max_shard_size,
        )
        logical = sum(map(nbytes, frames))
        entries = []
        if by_ref:
            st = _state()
            sizes = [n for n in map(nbytes, frames) if n >= st.threshold]
            if sizes and _on_loop(sizes):
                _stats.add(refs_on_loop=1)
                entries, frames = self._to_refs(frames)
            elif sizes:
                _stats.add(refs_offloaded=1)
                entries, frames = await offload(self._to_refs, frames)
        mark = msgpack.dumps([MARK_VERSION, self._nread, entries])
        frames, frames_nbytes, frames_nbytes_total = _add_frames_header([mark, *frames])
        try:
            for each_frame_nbytes, each_frame in zip(frames_nbytes, frames):
                if each_frame_nbytes:
                    each_frame = ensure_memoryview(each_frame)
                    for i, j in sliding_window(2, range(0, each_frame_nbytes + C_INT_MAX, C_INT_MAX)):
                        chunk = each_frame[i:j]
                        if stream._write_buffer is None:
                            raise StreamClosedError()
                        stream._write_buffer.append(chunk)
                        stream._total_write_index += chunk.nbytes
            stream.write(b"")
        except StreamClosedError as e:
            self.stream = None
            self._closed = True
            convert_stream_closed_error(self, e)
        except BaseException:
            self.abort()
            raise
        return logical

class ShmrefConnector(TCPConnector):
    prefix = SHMREF
    comm_class = ShmrefComm


class _WorkersHostDefault:
    """A worker's listener on all interfaces (no host given) gives the scheduler the
    address of the interface that reaches the scheduler, as over tcp://: distributed's
    Worker.start_unsafe (distributed/worker.py, 2026.8.0 line 1298) passes
    default_host=get_ip(get_address_host(self.scheduler.address)) to its listener only when
    its protocol is "tcp" or "tls", so a shmref:// worker was reachable at the machine's
    external address instead (issue 27, distributed's
    test_worker_listens_on_same_interface_by_default). The same rule here, for the
    listener a Worker opens (its comm handler is the Worker's bound handle_comm), when
    distributed passed no default_host."""

    def __init__(self, address, comm_handler, deserialize=True, allow_offload=True, default_host=None,
                 **connection_args):
        if default_host is None:
            default_host = _worker_default_host(comm_handler)
        super().__init__(address, comm_handler, deserialize=deserialize, allow_offload=allow_offload,
                         default_host=default_host, **connection_args)


def _worker_default_host(comm_handler):
    """get_ip(get_address_host(scheduler address)) when comm_handler is a Worker's, else None."""
    worker_module = sys.modules.get("distributed.worker")  # never imported for a scheduler or a client
    owner = getattr(comm_handler, "__self__", None)
    if worker_module is None or not isinstance(owner, worker_module.Worker):
        return None
    scheduler = getattr(owner, "scheduler", None)
    address = getattr(scheduler, "address", None)
    if not address:
        return None
    return get_ip(get_address_host(address))


class ShmrefListener(_WorkersHostDefault, TCPListener):
    prefix = SHMREF
    comm_class = ShmrefComm


class _ConnectsFirst:
    """Both backends connect to shmrefd when Dask first asks for a connector or listener,
    so the log says which transport at start-up (not at the first large frame)."""

    def get_connector(self):
        _state()
        return super().get_connector()

    def get_listener(self, loc, handle_comm, deserialize, **connection_args):
        _state()
        return super().get_listener(loc, handle_comm, deserialize, **connection_args)


class ShmrefBackend(_ConnectsFirst, TCPBackend):
    """The ``shmref://`` backend (entry point ``distributed.comm.backends``: shmref)."""

    _connector_class = ShmrefConnector
    _listener_class = ShmrefListener


class ShmrefTLSComm(ShmrefComm, TLS):
    """ShmrefComm over distributed's TLS stream: messages and descriptors are encrypted
    as tls:// encrypts them; frames by reference do not cross the network (the daemon's
    access policy decides who may acquire them)."""


class ShmrefTLSConnector(TLSConnector):
    prefix = SHMREF_TLS
    comm_class = ShmrefTLSComm


class ShmrefTLSListener(_WorkersHostDefault, TLSListener):
    prefix = SHMREF_TLS
    comm_class = ShmrefTLSComm


class ShmrefTLSBackend(_ConnectsFirst, TLSBackend):
    """The ``shmref+tls://`` backend: distributed's ``tls://`` (Security's ssl contexts,
    require_encryption honoured) with ShmrefComm's frames."""

    _connector_class = ShmrefTLSConnector
    _listener_class = ShmrefTLSListener
