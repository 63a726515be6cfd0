# SPDX-License-Identifier: MIT
"""The transport methods of the Python benchmark, each a client half and a server half.

Every method does the same work, the work of a client calling a compute server:
  - the client writes its N-element float64 input (every element: produce(dst));
  - the server, in another process, reads all of it and writes its own output of the same
    size, out = input + 1 (np.add into the output's memory: every page of both touched);
  - the client reads the server's output (one word per 4 KiB page inside the timed part;
    the runner then compares every element outside it: pybench.Payload.check).
No method hands the client's own buffer back. What each one copies is in its docstring and
in docs/performance.md.

Every method implements:
  client_open(ctx) / client_close()
  roundtrip(src, produce) -> ndarray   produce(dst) writes this iteration's data into dst
  finish()                             client-side cleanup once the output was read
  server_open(ctx) / handle(msg) -> reply bytes / server_close()   (socket methods)
  serve(conn)                          optional: a server loop of its own (iceoryx2)
ctx is a dict: 'indir', 'outdir' (scratch dirs on /dev/shm), 'shmref_socket', 'run_id'.
"""

import os
import re
import select
import uuid
from pathlib import Path

import numpy as np
import orjson
import pybase64

import wire

PAGE_ELEMS = 4096 // 8  # one float64 per 4 KiB page


def touch_pages(a):
    """Read one word per 4 KiB page (a lazy mapping is paid for)."""
    flat = a.reshape(-1)
    return float(flat[::PAGE_ELEMS].sum()) if flat.size else 0.0


def compute(src, dst):
    """The server's work: its own output, every element written from the input."""
    np.add(src, 1.0, out=dst)
    return dst


def _array_json(a, data):
    return {"object_type": "array", "shape": list(a.shape), "dtype": a.dtype.name, "data": data}


class Method:
    name = "?"
    transport = "socket"  # "socket": a server process on the control socket; "queue": its own
    needs = ()  # "shmref", "torch", "iceoryx2"
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


# base64 in JSON ---------------------------------------------------------------------------


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
    control socket, both ways: encode, 4 kernel copies of 4/3 the bytes, decode; the server
    computes into a new heap array."""

    name = "base64-json"
    what = "base64 in JSON over the Unix socket (pybase64 + orjson, tesseract-core's layout)"

    def roundtrip(self, src, produce):
        produce(src)
        return b64_decode(self._call(b64_encode(src)))

    def handle(self, msg):
        a = b64_decode(msg)
        return b64_encode(compute(a, np.empty_like(a)))


# pickle over a multiprocessing Pipe --------------------------------------------------------


def pipe_server(conn):
    """The pickle-over-a-Pipe server (module level: spawn imports it by name)."""
    while True:
        a = conn.recv()
        if a is None:
            break
        conn.send(compute(a, np.empty_like(a)))


class PicklePipe(Method):
    """multiprocessing.Pipe between two processes (spawn), arrays pickled by value both
    ways (Connection.send: ForkingPickler, protocol 5 without out-of-band buffers): the
    bytes are copied into the pickle, through the socket, and out of it on each side."""

    name = "pickle-pipe"
    transport = "queue"
    what = "multiprocessing.Pipe, arrays pickled by value"

    def client_open(self, ctx):
        super().client_open(ctx)
        import multiprocessing as mp

        mpctx = mp.get_context("spawn")
        self._conn, child = mpctx.Pipe()
        self._proc = mpctx.Process(target=pipe_server, args=(child,), daemon=True)
        self._proc.start()
        child.close()

    def client_close(self):
        self._conn.send(None)
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=10)
        self._conn.close()

    def roundtrip(self, src, produce):
        produce(src)
        self._conn.send(src)
        return self._conn.recv()


# tesseract-core's binref -------------------------------------------------------------------

_BUFSPEC = re.compile(r"^(?P<path>.+?)(\:(?P<offset>\d+))?$")


def _binref_out_path(d, outdir):
    m = _BUFSPEC.match(d["data"]["buffer"])
    dtype = np.dtype(d["dtype"])
    count = int(np.prod(d["shape"])) if len(d["shape"]) else 1
    return Path(outdir) / m.group("path"), int(m.group("offset") or 0), count * dtype.itemsize, dtype, count


class _BinrefServer(Method):
    """The server half of both binref methods does what tesseract-core's runtime does
    with a json+binref request: runtime.array_encoding.load_binref_arraydict reads the
    input file into an owned array (readinto: one copy), the server computes its output
    into a new array, and dump_binref_arraydict writes it to a new file in the output
    directory (one copy into fresh pages)."""

    def server_open(self, ctx):
        super().server_open(ctx)
        from tesseract_core.runtime import array_encoding

        self._rt = array_encoding

    def handle(self, msg):
        d = orjson.loads(msg)
        a = self._rt.load_binref_arraydict(d, self.ctx["indir"])
        out, _ = self._rt.dump_binref_arraydict(compute(a, np.empty_like(a)), self.ctx["outdir"], None,
                                                str(uuid.uuid4()))
        return orjson.dumps(out)


class BinrefFresh(_BinrefServer):
    """tesseract-core's json+binref without the pool: the client writes a new .bin file
    per request (sdk.binref.encode_array_binref), the server reads it into its heap and
    writes its output to another new file, the client reads that into its heap
    (sdk.binref.read_binref_array, the SDK's default eager decode). Every page of both
    files fresh. tesseract-core leaves output files to nobody; here the client unlinks both
    files after reading (counted)."""

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
    decode), unlinking it as the SDK does. The server side is the runtime's (above); the
    output file's pages are fresh and mapped anew on each call."""

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


# multiprocessing.shared_memory ------------------------------------------------------------


def _shm_array(shm, shape, dtype):
    return np.ndarray(shape, dtype=dtype, buffer=shm.buf)


def _untrack(shm):
    # Python 3.11 registers every SharedMemory, attached or created, with this process's
    # resource tracker, which unlinks it at exit; the peer that unlinks is the owner.
    from multiprocessing import resource_tracker

    resource_tracker.unregister(shm._name, "shared_memory")


class SharedMemoryMethod(Method):
    """multiprocessing.shared_memory, a segment per array as its users write it: the
    client creates a segment, writes its input into it and sends the name; the server
    attaches, creates its output segment and computes into it; the client attaches that and
    reads it in place, then unlinks both. Every page of both segments fresh."""

    name = "mp-shared-memory"
    what = "multiprocessing.shared_memory, a new segment per array"

    def client_open(self, ctx):
        super().client_open(ctx)
        from multiprocessing import shared_memory

        self._sm = shared_memory
        self._held = []

    def roundtrip(self, src, produce):
        shm = self._sm.SharedMemory(create=True, size=max(src.nbytes, 1))
        self._held = [shm]
        produce(_shm_array(shm, src.shape, src.dtype))
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
        compute(a, _shm_array(outshm, shape, d["dtype"]))
        del a
        inshm.close()
        outshm.close()
        return orjson.dumps({"name": outshm.name, "shape": shape, "dtype": d["dtype"]})


class SharedMemoryReused(Method):
    """The best hand-written multiprocessing.shared_memory: a reused pair. The client keeps
    one input segment per size and the server one output segment, both created once and
    kept mapped (warm); per call the client writes its input in place and sends a small
    message, the server computes into its output segment, the client reads it in place.
    Safe only because each side waits for the other before it writes again."""

    name = "mp-shared-memory-reused"
    what = "multiprocessing.shared_memory, one warm segment per side, reused"

    def client_open(self, ctx):
        super().client_open(ctx)
        from multiprocessing import shared_memory

        self._sm = shared_memory
        self._mine = {}   # size -> my input segment
        self._theirs = {}  # name -> the server's output segment, attached once

    def client_close(self):
        for shm in self._theirs.values():
            shm.close()
        for shm in self._mine.values():
            shm.close()
            shm.unlink()

    def roundtrip(self, src, produce):
        shm = self._mine.get(src.nbytes)
        if shm is None:
            shm = self._mine[src.nbytes] = self._sm.SharedMemory(create=True, size=max(src.nbytes, 1))
        produce(_shm_array(shm, src.shape, src.dtype))
        r = orjson.loads(self._call(orjson.dumps({"name": shm.name, "shape": src.shape, "dtype": src.dtype.str})))
        out = self._theirs.get(r["name"])
        if out is None:
            out = self._theirs[r["name"]] = self._sm.SharedMemory(name=r["name"])
            _untrack(out)
        return _shm_array(out, tuple(r["shape"]), r["dtype"])

    def server_open(self, ctx):
        super().server_open(ctx)
        from multiprocessing import shared_memory

        self._sm = shared_memory
        self._inputs = {}
        self._outputs = {}

    def server_close(self):
        for shm in self._inputs.values():
            shm.close()
        for shm in self._outputs.values():
            shm.close()
            shm.unlink()

    def handle(self, msg):
        d = orjson.loads(msg)
        shape = tuple(d["shape"])
        inshm = self._inputs.get(d["name"])
        if inshm is None:
            inshm = self._inputs[d["name"]] = self._sm.SharedMemory(name=d["name"])
            _untrack(inshm)
        a = _shm_array(inshm, shape, d["dtype"])
        outshm = self._outputs.get(a.nbytes)
        if outshm is None:
            outshm = self._outputs[a.nbytes] = self._sm.SharedMemory(create=True, size=max(a.nbytes, 1))
        compute(a, _shm_array(outshm, shape, d["dtype"]))
        return orjson.dumps({"name": outshm.name, "shape": shape, "dtype": d["dtype"]})


# torch.multiprocessing --------------------------------------------------------------------


def torch_server(in_q, out_q, reuse):
    """The torch.multiprocessing server: computes each tensor's output and puts it back.
    reuse: into one share_memory_() tensor per shape (a handle is sent, no bytes), else into
    a new tensor, which the queue moves into a new shared-memory segment (1 copy).
    (Module level: spawn imports it by name.)"""
    import torch

    outs = {}
    while True:
        t = in_q.get(timeout=300)
        if t is None:
            break
        if reuse:
            out = outs.get(tuple(t.shape))
            if out is None:
                out = outs[tuple(t.shape)] = torch.empty(t.shape, dtype=t.dtype).share_memory_()
        else:
            out = torch.empty_like(t)
        compute(t.numpy(), out.numpy())
        out_q.put(out)
        del t, out


class TorchQueue(Method):
    """torch.multiprocessing tensors through a queue, as its users write it: the client
    puts torch.from_numpy(array); pickling moves the tensor's storage into a new shared
    memory segment (1 copy into fresh pages) and sends its fd; the server computes a new
    tensor, which the queue moves the same way; the client maps it and reads it in place."""

    name = "torch-mp-queue"
    transport = "queue"
    needs = ("torch",)
    what = "torch.multiprocessing queue, torch.from_numpy(array) per call (1 copy into a new segment each way)"
    reuse = False

    def client_open(self, ctx):
        super().client_open(ctx)
        import torch
        import torch.multiprocessing as tmp

        self._torch = torch
        mpctx = tmp.get_context("spawn")
        self._in, self._out = mpctx.Queue(), mpctx.Queue()
        self._proc = mpctx.Process(target=torch_server, args=(self._in, self._out, self.reuse), daemon=True)
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
    """The same queue with one share_memory_() tensor on each side, written in place on
    every call: each put sends a handle, no bytes are copied. Only safe because each side
    waits for the other before it writes again."""

    name = "torch-mp-queue-shared"
    what = "torch.multiprocessing queue, one share_memory_() tensor per side written in place"
    reuse = True

    def _tensor(self, src, produce):
        if self._shared is None or self._shared.shape != src.shape:
            self._shared = self._torch.empty(src.shape, dtype=self._torch.float64).share_memory_()
        produce(self._shared.numpy())
        return self._shared


# iceoryx2 ---------------------------------------------------------------------------------


class _Iox2Ports:
    """One direction's publisher and the other's subscriber, and an event each way, on
    services named after the run (so two runs never meet)."""

    def __init__(self, ctx, mine, theirs):
        import ctypes

        import iceoryx2 as iox2

        self.iox2 = iox2
        iox2.set_log_level_from_env_or(iox2.LogLevel.Error)
        # The run's own root directory and /dev/shm prefix: nothing of it outlives the run
        # (pybench removes the prefix's files at the end) and no other iceoryx2 user meets it.
        cfg = iox2.config.default()
        cfg.global_cfg.root_path = iox2.Path.new(ctx["iox2_root"])
        cfg.global_cfg.prefix = iox2.FileName.new(ctx["iox2_prefix"])
        self.node = iox2.NodeBuilder.new().config(cfg).create(iox2.ServiceType.Ipc)
        run_id = ctx["run_id"]

        def pubsub(name):
            return (self.node.service_builder(iox2.ServiceName.new(f"shmref-bench/{run_id}/{name}"))
                    .publish_subscribe(iox2.Slice[ctypes.c_uint8]).open_or_create())

        def event(name):
            return (self.node.service_builder(iox2.ServiceName.new(f"shmref-bench/{run_id}/{name}-ev"))
                    .event().open_or_create())

        self.pub = (pubsub(mine).publisher_builder().initial_max_slice_len(4096)
                    .allocation_strategy(iox2.AllocationStrategy.PowerOfTwo).create())
        self.sub = pubsub(theirs).subscriber_builder().create()
        self.notifier = event(mine).notifier_builder().create()
        self.listener = event(theirs).listener_builder().create()

    def loan(self, nbytes):
        """A loaned sample and a float64 view of its payload (written in place)."""
        s = self.pub.loan_slice_uninit(max(nbytes, 8))
        view = np.frombuffer(s.payload().as_memory_view(), dtype=np.uint8)[:nbytes].view(np.float64)
        return s, view

    def send(self, sample):
        sample.assume_init().send()
        self.notifier.notify()

    def receive(self, timeout_s):
        """The next sample and a float64 view of it, waiting on the event."""
        deadline = self.iox2.Duration.from_secs_f64(timeout_s) if hasattr(self.iox2.Duration, "from_secs_f64") \
            else self.iox2.Duration.from_millis(int(timeout_s * 1000))
        while True:
            s = self.sub.receive()
            if s is not None:
                p = s.payload()
                return s, np.frombuffer(p.as_memory_view(), dtype=np.uint8).view(np.float64)
            self.listener.timed_wait(deadline)


class Iceoryx2(Method):
    """iceoryx2 from PyPI (Python binding), publish-subscribe with loans and event
    wake-ups, the way its examples write it: the client loans a sample, writes its input
    in place, sends it and notifies; the server, woken by the event, receives it, loans
    its own output sample, computes into it, sends and notifies; the client receives and
    reads it in place, then drops both samples. No copy of the array."""

    name = "iceoryx2"
    needs = ("iceoryx2",)
    what = "iceoryx2 (PyPI) publish-subscribe, loaned samples, event wake-ups"

    def client_open(self, ctx):
        super().client_open(ctx)
        self._p = _Iox2Ports(ctx, "req", "resp")
        wire.send(self.sock, b"go")  # the server's ports exist: its subscriber sees ours
        if wire.recv(self.sock) != b"ok":
            raise RuntimeError("iceoryx2 server did not connect")
        self._held = None

    def client_close(self):
        self._held = None
        self._p = None

    def roundtrip(self, src, produce):
        s, view = self._p.loan(src.nbytes)
        produce(view.reshape(src.shape))
        self._p.send(s)
        r, out = self._p.receive(300)
        self._held = r
        return out[: src.size].reshape(src.shape)

    def finish(self):
        self._held = None

    def serve(self, conn):
        p = _Iox2Ports(self.ctx, "resp", "req")
        if wire.recv(conn) != b"go":
            return
        wire.send(conn, b"ok")
        while True:
            s = p.sub.receive()
            if s is None:
                if select.select([conn], [], [], 0)[0]:  # the client closed the control socket
                    return
                p.listener.timed_wait(p.iox2.Duration.from_millis(200))
                continue
            a = np.frombuffer(s.payload().as_memory_view(), dtype=np.uint8).view(np.float64)
            o, view = p.loan(a.nbytes)
            compute(a, view)
            del a
            s = None
            p.send(o)


# shmref ------------------------------------------------------------------------------------


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
        self._last = None

    def server_close(self):
        self._last = None
        self.client.close()

    def _output(self, a):
        """The server's output: a lease of a's shape, computed into, published. Held until
        the next request (by then the client has acquired it)."""
        if self._last is not None:
            self.client.release(self._last)
            self._last = None
        out = self.client.empty(a.shape, a.dtype)
        compute(a, out)
        ref = self.client.publish(out)
        self._last = out
        return out, ref


class ShmrefEncode(_Shmref):
    """shmref.encode / shmref.decode, tesseract-core's array JSON with encoding "shmref":
    the client's heap array is copied once into a new buffer (arrays up to
    shmref.INLINE_MAX, 64 KiB, travel inline as base64 instead: the 1e3 row); the server
    decodes it to a read-only view (an acquire), computes into a lease of its own and
    returns it with shmref.encode, which carries a published array's descriptor without a
    copy; the client decodes (acquires) it."""

    name = "shmref-encode"
    what = "shmref.encode / shmref.decode; the server computes into a lease of its own"

    def roundtrip(self, src, produce):
        produce(src)
        msg = orjson.dumps(self._s.encode(src, self.client))
        return self._s.decode(orjson.loads(self._call(msg)), self.client)

    def handle(self, msg):
        a = self._s.decode(orjson.loads(msg), self.client)
        if a.nbytes <= self._s.INLINE_MAX:
            return orjson.dumps(self._s.encode(compute(a, np.empty_like(a)), self.client))
        out, _ = self._output(a)
        del a
        return orjson.dumps(self._s.encode(out, self.client))


class ShmrefEncodeCopy(ShmrefEncode):
    """The same, with a server written without shmref in mind: it computes into a new heap
    array (a + 1) and shmref.encode copies that into a new buffer."""

    name = "shmref-encode-copy"
    what = "shmref.encode / shmref.decode; the server returns a new heap array (copied by encode)"

    def handle(self, msg):
        a = self._s.decode(orjson.loads(msg), self.client)
        return orjson.dumps(self._s.encode(compute(a, np.empty_like(a)), self.client))


class ShmrefZeroCopy(_Shmref):
    """shmref zero-copy: the client leases (Client.empty), writes its input in place,
    publishes and sends the descriptor text; the server acquires a read-only view, leases
    its output, computes into it, publishes it and releases the input; the client acquires
    the output and reads it in place, then releases both. No copy of the array."""

    name = "shmref-zerocopy"
    what = "shmref zero-copy: Client.empty + publish on both sides, acquire on both sides"

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
        b = self.client.acquire(bytes(msg).decode())
        _, ref = self._output(b)
        self.client.release(b)
        del b
        return str(ref).encode()


ALL = [
    Base64Json,
    PicklePipe,
    BinrefFresh,
    BinrefPool,
    SharedMemoryMethod,
    SharedMemoryReused,
    TorchQueue,
    TorchQueueShared,
    Iceoryx2,
    ShmrefEncode,
    ShmrefEncodeCopy,
    ShmrefZeroCopy,
]
BY_NAME = {m.name: m for m in ALL}


def serve(name, sock_path, ctx):
    """The server process of a socket method: bind, accept one client, answer until EOF
    (or run the method's own loop)."""
    m = BY_NAME[name]()
    m.server_open(ctx)
    ls = wire.listen(sock_path)
    print("ready", flush=True)
    conn, _ = ls.accept()
    try:
        if hasattr(m, "serve"):
            m.serve(conn)
        else:
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
