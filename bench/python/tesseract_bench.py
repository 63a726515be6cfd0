# SPDX-License-Identifier: MIT
"""The seed's table reproduced, with a server that writes its own output: the Tesseract of
tesseract_noop/ (apply returns input + 1, a new array) served locally by
tesseract-core's own runtime, no docker (Tesseract.from_source: a `tesseract-runtime
serve` subprocess of this venv's interpreter, uvicorn on 127.0.0.1, debug mode off),
called through tesseract-core's client (Tesseract.apply) once per client format:

  json+base64        the array base64 in the HTTP body, both ways
  json+binref        the client writes a fresh .bin file in the input dir, the runtime
                     reads it and writes its output to a fresh file the client reads
  json+binref pool   the same with experimental_binref_pool=True: the client copies into
                     4 warm mapped files and maps the output read-only
  shmref             the `ref` field: shmref.encode's array JSON (encoding "shmref") as
                     text, the client's heap array copied once into a buffer; the
                     Tesseract decodes it with shmref.decode, computes into a lease of
                     its own and answers with shmref.encode of it (its descriptor)
  shmref zero-copy   the same field, but the client writes its array in place in a lease
                     (Client.empty) and publishes it; shmref.encode of a published array
                     carries its descriptor without a copy

Input and output directories are on /dev/shm, as tesseract-core's docs ask for the pool.
"""

import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
API = os.path.join(HERE, "tesseract_noop", "tesseract_api.py")
BASELINE = "json+binref pool"
FORMATS = [
    ("json+base64", {"output_format": "json+base64"}),
    ("json+binref", {"output_format": "json+binref"}),
    ("json+binref pool", {"output_format": "json+binref", "experimental_binref_pool": True}),
    ("shmref", {"output_format": "json+base64"}),
    ("shmref zero-copy", {"output_format": "json+base64"}),
]
# Tesseract rows cost milliseconds even when empty: fewer iterations than the round trip
PLAN = {1_000: (5, 100), 100_000: (3, 40), 10_000_000: (2, 6), 100_000_000: (2, 2)}
ROW_BUDGET_S = 25.0


class TesseractCall:
    """One client format against the served no-op Tesseract, in the shape run_row expects."""

    def __init__(self, name, tess, client, outdir):
        self.name = name
        self.tess = tess
        self.client = client
        self.outdir = outdir
        self._res = None
        self._held = None
        if name.startswith("shmref"):
            import shmref

            self._s = shmref

    def roundtrip(self, src, produce):
        if self.name == "shmref zero-copy":
            a = self.client.empty(src.shape, src.dtype)
            produce(a)
            self.client.publish(a)
            self._held = a  # the producer holds its lease until the round trip is done
            res = self.tess.apply({"ref": json.dumps(self._s.encode(a, self.client))})
            self._res = self._s.decode(json.loads(res["ref"]), self.client)
            return self._res
        produce(src)
        if self.name == "shmref":
            res = self.tess.apply({"ref": json.dumps(self._s.encode(src, self.client))})
            self._res = self._s.decode(json.loads(res["ref"]), self.client)
        else:
            self._res = self.tess.apply({"a": src})["a"]
        return self._res

    def finish(self):
        self._res = None
        if self._held is not None:
            self.client.release(self._held)
            self._held = None

    def after(self):
        # The runtime makes a run_<id>/ directory in the output dir per request, and plain
        # json+binref leaves its output files in it (nobody owns them); removed here,
        # outside the timed part, so /dev/shm does not fill up.
        for f in os.listdir(self.outdir):
            p = os.path.join(self.outdir, f)
            if os.path.isdir(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)


def run(args, ctx, have, sizes, Payload, run_row, stats, record, log):
    from tesseract_core import Tesseract

    rows = []
    for name, kw in FORMATS:
        if name.startswith("shmref") and not have.get("shmref"):
            for n in sizes:
                rows.append(record("tesseract", name, n, skipped="needs shmref"))
            log(f"  {name}: skipped (needs shmref)")
            continue
        base = os.path.join(os.path.dirname(ctx["indir"]), "tess-" + name.replace(" ", "-").replace("+", "-"))
        indir, outdir = os.path.join(base, "in"), os.path.join(base, "out")
        os.makedirs(indir)
        os.makedirs(outdir)
        client = None
        try:
            tess = Tesseract.from_source(
                API,
                input_path=indir,
                output_path=outdir,
                python_executable=sys.executable,
                runtime_config={"debug": False},
                **kw,
            )
            with tess:
                if name.startswith("shmref"):
                    import shmref

                    client = shmref.connect(ctx["shmref_socket"], timeout=30)
                call = TesseractCall(name, tess, client, outdir)
                for n in sizes:
                    warm, iters = (1, 3) if args.smoke else PLAN.get(n, (1, 3))
                    try:
                        samples = run_row(call, Payload(n, args.smoke), warm, iters, ROW_BUDGET_S)
                        med, p90 = stats(samples)
                        rows.append(record("tesseract", name, n, iterations=len(samples), median_ms=med, p90_ms=p90))
                        log(f"  {name:24s} {n:>11,d}  {med:10.3f} ms  (p90 {p90:.3f}, {len(samples)} it)")
                    except Exception as e:
                        rows.append(record("tesseract", name, n, error=f"{type(e).__name__}: {e}"))
                        log(f"  {name:24s} {n:>11,d}  ERROR {type(e).__name__}: {e}")
                        break
        except Exception as e:
            rows.append(record("tesseract", name, sizes[0], error=f"{type(e).__name__}: {e}"))
            log(f"  {name}: ERROR {type(e).__name__}: {e}")
        finally:
            if client is not None:
                client.close()
            shutil.rmtree(base, ignore_errors=True)
    return rows
