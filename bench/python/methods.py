# SPDX-License-Identifier: MIT
"""The transport methods of the Python benchmark, each a client half and a server half.

A round trip: the client produces one float64 array (in its heap, or for zero-copy
methods in the buffer it will hand over), sends it to a no-op server in another process,
and reads the array the server sends back. The server returns its input, through the
same method, the way a user of that method writes it. What each method copies is in its
docstring and in docs/performance.md.

Every method implements:
  client_open(ctx) / client_close()
  roundtrip(src, produce) -> ndarray   produce(dst) writes this iteration's data into dst
  finish()                             client-side cleanup once the output was read
  server_open(ctx) / handle(msg) -> reply bytes / server_close()   (socket methods)
ctx is a dict: 'indir', 'outdir' (scratch dirs on /dev/shm), 'shmref_socket'.
"""

import os
import re
import uuid
from pathlib import Path

import numpy as np
import orjson
import pybase64

import wire

PAGE_ELEMS = 4096 // 8  # one float64 per 4 KiB page


def touch_pages(a):
    """What a no-op consumer that works in place does: read one word per 4 KiB page."""
    flat = a.reshape(-1)
    return float(flat[::PAGE_ELEMS].sum()) if flat.size else 0.0


def _array_json(a, data):
    return {"object_type": "array", "shape": list(a.shape), "dtype": a.dtype.name, "data": data}


class Method:
    name = "?"
    transport = "socket"  # "socket": a server process on the control socket; "queue": its own
    needs = ()  # "shmref", "torch"
    what = ""

    def client_open(self, ctx):
        self.ctx = ctx

    def client_close(self):
        pass

    def finish(self):
        pass

    def server_open(self, ctx):
        self.ctx = ctx

    def server_close(self):
        pass

    # The control socket, set by the runner for socket methods.
    sock = None

    def _call(self, payload):
        wire.send(self.sock, payload)
        reply = wire.recv(self.sock)
        if reply is None:
            raise EOFError(f"{self.name}: server closed the control socket")
        return reply


# (a) ------------------------------------------------------------------------------------


def b64_encode(a):
    """tesseract-core's json+base64 array layout (the same calls as its
    runtime.array_encoding._dump_base64_arraydict: pybase64 over the array's buffer)."""
    a = np.ascontiguousarray(a)
    return orjson.dumps(_array_json(a, {"buffer": pybase64.b64encode_as_string(a.data), "encoding": "base64"}))


def b64_decode(msg):
    d = orjson.loads(msg)
    buf = pybase64.b64decode(d["data"]["buffer"], validate=True)
    return np.frombuffer(buf, dtype=d["dtype"]).reshape(d["shape"])


class Base64Json(Method):
    """base64 text in JSON (pybase64 + orjson, as tesseract-core's json+base64) over the
    control socket, both ways: encode, 4 kernel copies of 4/3 the bytes, decode."""

    name = "base64-json"
    what = "base64 in JSON over the Unix socket (pybase64 + orjson, tesseract-core's layout)"

    def roundtrip(self, src, produce):
        produce(src)
        return b64_decode(self._call(b64_encode(src)))

    def handle(self, msg):
        return b64_encode(b64_decode(msg))


# (b), (c) --------------------------------------------------------------------------------

_BUFSPEC = re.compile(r"^(?P<path>.+?)(\:(?P<offset>\d+))?$")


def _binref_out_path(d, outdir):
    m = _BUFSPEC.match(d["data"]["buffer"])
    dtype = np.dtype(d["dtype"])
    count = int(np.prod(d["shape"])) if len(d["shape"]) else 1
    return Path(outdir) / m.group("path"), int(m.group("offset") or 0), count * dtype.itemsize, dtype, count


class _BinrefServer(Method):
    """The server half of both binref methods does what tesseract-core's runtime does
    with a json+binref request: runtime.array_encoding.load_binref_arraydict reads the
    input file into an owned array (readinto: one copy), dump_binref_arraydict writes
    the output to a new file in the output directory (one copy into fresh pages)."""

    def server_open(self, ctx):
        super().server_open(ctx)
        from tesseract_core.runtime import array_encoding

        self._rt = array_encoding

    def handle(self, msg):
        d = orjson.loads(msg)
        a = self._rt.load_binref_arraydict(d, self.ctx["indir"])
        out, _ = self._rt.dump_binref_arraydict(a, self.ctx["outdir"], None, str(uuid.uuid4()))
        return orjson.dumps(out)


class BinrefFresh(_BinrefServer):
    """tesseract-core's json+binref without the pool: the client writes a new .bin file
    per request (sdk.binref.encode_array_binref), the server reads it into its heap and
    writes its output to another new file, the client reads that into its heap
    (sdk.binref.read_binref_array, the SDK's default eager decode). 4 copies, every page
    of both files fresh. tesseract-core leaves output files to nobody; here the client
    unlinks both files after reading (counted)."""

    name = "tc-binref-fresh"
    what = "tesseract-core binref, a fresh file per request (sdk.binref.encode_array_binref / read_binref_array)"

    def client_open(self, ctx):
        super().client_open(ctx)
        from tesseract_core.sdk import binref

        self._b = binref
        self._files = []

    def roundtrip(self, src, produce):
        produce(src)
        written = []
        d = self._b.encode_array_binref(src, Path(self.ctx["indir"]), written)
        d["object_type"] = "array"
        r = orjson.loads(self._call(orjson.dumps(d)))
        path, off, nbytes, dtype, count = _binref_out_path(r, self.ctx["outdir"])
        out = self._b.read_binref_array(path, off, nbytes, dtype, count).reshape(r["shape"])
        self._files = written + [path]
        return out

    def finish(self):
        for f in self._files:
            f.unlink(missing_ok=True)
        self._files = []


class BinrefPool(BinrefFresh):
    """tesseract-core's experimental_binref_pool: the client copies its array into one of
    4 warm, pre-faulted, mapped slots (sdk.binref.BinrefWritePool +
    encode_array_binref_pooled), checks the slot back in once the reply is there, and maps
    the server's output file read-only (sdk.binref.mmap_binref_array, the pool's lazy
    decode), unlinking it as the SDK does. The server side is the runtime's (above). 3
    copies; the output file's pages are fresh and mapped anew on each call."""

    name = "tc-binref-pool"
    what = "tesseract-core binref pool (BinrefWritePool + encode_array_binref_pooled / mmap_binref_array)"

    def client_open(self, ctx):
        super().client_open(ctx)
        self._pool = self._b.BinrefWritePool(Path(self.ctx["indir"]))

    def client_close(self):
        self._pool.close()

    def roundtrip(self, src, produce):
        produce(src)
        slots, written = [], []
        d = self._b.encode_array_binref_pooled(src, self._pool, slots, written)
        d["object_type"] = "array"
        reply = self._call(orjson.dumps(d))
        for s in slots:
            self._pool.checkin(s)
        r = orjson.loads(reply)
        path, off, nbytes, dtype, count = _binref_out_path(r, self.ctx["outdir"])
        out = self._b.mmap_binref_array(path, off, nbytes, dtype, count).reshape(r["shape"])
        path.unlink(missing_ok=True)
        self._files = written
        return out


# (d) -------------------------------------------------------------------------------------


def _shm_array(shm, shape, dtype):
    return np.ndarray(shape, dtype=dtype, buffer=shm.buf)


def _untrack(shm):
    # Python 3.11 registers every SharedMemory, attached or created, with this process's
    # resource tracker, which unlinks it at exit; the peer that unlinks is the owner.
    from multiprocessing import resource_tracker

    resource_tracker.unregister(shm._name, "shared_memory")


class SharedMemoryMethod(Method):
    """multiprocessing.shared_memory, a segment per array as its users write it: the
    client creates a segment, copies its array in and sends the name; the server attaches,
    creates its output segment and copies into it; the client attaches that and reads it
    in place, then unlinks both. 2 copies, every page of both segments fresh."""

    name = "mp-shared-memory"
    what = "multiprocessing.shared_memory, a new segment per array (2 copies)"

    def client_open(self, ctx):
        super().client_open(ctx)
        from multiprocessing import shared_memory

        self._sm = shared_memory
        self._held = []

    def roundtrip(self, src, produce):
        produce(src)
        shm = self._sm.SharedMemory(create=True, size=max(src.nbytes, 1))
        _shm_array(shm, src.shape, src.dtype)[...] = src
        self._held = [shm]
        r = orjson.loads(self._call(orjson.dumps({"name": shm.name, "shape": src.shape, "dtype": src.dtype.str})))
        outshm = self._sm.SharedMemory(name=r["name"])
        self._held.append(outshm)
        return _shm_array(outshm, tuple(r["shape"]), r["dtype"])

    def finish(self):
        for shm in self._held:
            shm.close()
            shm.unlink()
        self._held = []

    def server_open(self, ctx):
        super().server_open(ctx)
        from multiprocessing import shared_memory

        self._sm = shared_memory

    def handle(self, msg):
        d = orjson.loads(msg)
        shape = tuple(d["shape"])
        inshm = self._sm.SharedMemory(name=d["name"])
        _untrack(inshm)
        a = _shm_array(inshm, shape, d["dtype"])
        outshm = self._sm.SharedMemory(create=True, size=max(a.nbytes, 1))
        _untrack(outshm)
        _shm_array(outshm, shape, d["dtype"])[...] = a
        del a
        inshm.close()
        outshm.close()
        return orjson.dumps({"name": outshm.name, "shape": shape, "dtype": d["dtype"]})


# (e) -------------------------------------------------------------------------------------


def torch_server(in_q, out_q):
    """The no-op torch.multiprocessing server: return each tensor it gets. A tensor that
    arrives is already in shared memory, so putting it back sends a handle, not bytes.
    (Module level: spawn imports it by name.)"""
    import torch  # noqa: F401  (registers the reductions before the first get)

    while True:
        t = in_q.get(timeout=300)
        if t is None:
            break
        touch_pages(t.numpy())
        out_q.put(t)
        del t


class TorchQueue(Method):
    """torch.multiprocessing tensors through a queue, as its users write it: the client
    puts torch.from_numpy(array); pickling moves the tensor's storage into a new shared
    memory segment (1 copy into fresh pages) and sends its fd; the no-op server reads one
    word per page and puts the same tensor back (a handle, no copy); the client maps it
    again and reads it in place."""

    name = "torch-mp-queue"
    transport = "queue"
    needs = ("torch",)
    what = "torch.multiprocessing queue, torch.from_numpy(array) per call (1 copy into a new segment)"
    reuse = False

    def client_open(self, ctx):
        super().client_open(ctx)
        import torch
        import torch.multiprocessing as tmp

        self._torch = torch
        mpctx = tmp.get_context("spawn")
        self._in, self._out = mpctx.Queue(), mpctx.Queue()
        self._proc = mpctx.Process(target=torch_server, args=(self._in, self._out), daemon=True)
        self._proc.start()
        self._shared = None
        self._res = None

    def client_close(self):
        self._in.put(None)
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=10)

    def _tensor(self, src, produce):
        produce(src)
        return self._torch.from_numpy(src)

    def roundtrip(self, src, produce):
        t = self._tensor(src, produce)
        self._in.put(t)
        self._res = self._out.get(timeout=300)
        return self._res.numpy()

    def finish(self):
        self._res = None


class TorchQueueShared(TorchQueue):
    """The same queue with a tensor moved to shared memory once (share_memory_()) and
    written in place on every call: each put sends a handle, no bytes are copied. Only
    safe because the client waits for the reply before it writes again."""

    name = "torch-mp-queue-shared"
    what = "torch.multiprocessing queue, one share_memory_() tensor written in place (0 copies)"
    reuse = True

    def _tensor(self, src, produce):
        if self._shared is None or self._shared.shape != src.shape:
            self._shared = self._torch.empty(src.shape, dtype=self._torch.float64).share_memory_()
        produce(self._shared.numpy())
        return self._shared


# (f), (g) --------------------------------------------------------------------------------


class _Shmref(Method):
    needs = ("shmref",)

    def client_open(self, ctx):
        super().client_open(ctx)
        import shmref

        self._s = shmref
        self.client = shmref.connect(ctx["shmref_socket"], timeout=30)

    def client_close(self):
        self.client.close()

    def server_open(self, ctx):
        super().server_open(ctx)
        import shmref

        self._s = shmref
        self.client = shmref.connect(ctx["shmref_socket"], timeout=30)

    def server_close(self):
        self.client.close()


class ShmrefEncode(_Shmref):
    """shmref.encode / shmref.decode, tesseract-core's array JSON with encoding "shmref":
    the client's heap array is copied once into a buffer published with retention
    (Client.share) and its descriptor travels in the JSON (arrays up to shmref.INLINE_MAX,
    64 KiB, travel inline as base64 instead: the 1e3 row); the server decodes it to a
    read-only view (an acquire) and returns it with shmref.encode, which forwards an
    acquired array's descriptor without a copy; the client decodes (acquires) it. 1 copy.
    The package's rule for a forwarded array is that its holder keeps it alive until the
    peer acquired it, so the server holds its last result until the next request."""

    name = "shmref-encode"
    what = "shmref.encode / shmref.decode, the server forwards what it decoded (1 copy)"
    copy_result = False

    def roundtrip(self, src, produce):
        produce(src)
        msg = orjson.dumps(self._s.encode(src, self.client))
        return self._s.decode(orjson.loads(self._call(msg)), self.client)

    def handle(self, msg):
        self._last = None  # the previous result: the client has it by now
        a = self._s.decode(orjson.loads(msg), self.client)
        if self.copy_result:
            a = np.array(a)
        self._last = a
        return orjson.dumps(self._s.encode(a, self.client))


class ShmrefEncodeCopy(ShmrefEncode):
    """The same, with a server that returns a new array (np.array of its input), as one
    that computes a result does: shmref.encode copies it into a new buffer published with
    retention. 2 copies."""

    name = "shmref-encode-copy"
    what = "shmref.encode / shmref.decode, the server returns a new array (2 copies)"
    copy_result = True


class ShmrefZeroCopy(_Shmref):
    """shmref zero-copy: the client leases (Client.empty), writes in place, publishes and
    sends the descriptor text; the server acquires a read-only view, reads one word per
    page and returns the same descriptor (a no-op forwards what it got); the client
    acquires and reads in place; then both release. No copy of the array."""

    name = "shmref-zerocopy"
    what = "shmref zero-copy: Client.empty + publish, acquire on both sides (0 copies)"

    def roundtrip(self, src, produce):
        a = self.client.empty(src.shape, src.dtype)
        produce(a)
        ref = str(self.client.publish(a))
        back = bytes(self._call(ref.encode())).decode()
        out = self.client.acquire(back)
        self._held = (out, a)
        return out

    def finish(self):
        # Dropping the last references gives both buffers back at once (release() would
        # raise BufferError while the harness still holds the result it returned).
        self._held = ()

    def handle(self, msg):
        text = bytes(msg).decode()
        b = self.client.acquire(text)
        touch_pages(b)
        self.client.release(b)
        return msg


ALL = [
    Base64Json,
    BinrefFresh,
    BinrefPool,
    SharedMemoryMethod,
    TorchQueue,
    TorchQueueShared,
    ShmrefEncode,
    ShmrefEncodeCopy,
    ShmrefZeroCopy,
]
BY_NAME = {m.name: m for m in ALL}


def serve(name, sock_path, ctx):
    """The server process of a socket method: bind, accept one client, answer until EOF."""
    m = BY_NAME[name]()
    m.server_open(ctx)
    ls = wire.listen(sock_path)
    print("ready", flush=True)
    conn, _ = ls.accept()
    try:
        while True:
            msg = wire.recv(conn)
            if msg is None:
                break
            wire.send(conn, m.handle(msg))
    finally:
        conn.close()
        ls.close()
        m.server_close()
        os.unlink(sock_path)
