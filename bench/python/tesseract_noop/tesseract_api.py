# SPDX-License-Identifier: MIT
"""The Python benchmark's Tesseract: apply returns its input + 1, a new array of the same
size (the same work as every round-trip method of the benchmark: a server writes its own
output).

`a` is an ordinary tesseract-core Array field, moved by whatever the client asks for
(json+base64, json+binref, the binref pool). `ref` carries the same array as shmref's
array JSON (shmref.encode output, encoding "shmref", as JSON text): tesseract-core 1.15
has no hook for a new array encoding, and its client decodes every dict with
object_type "array" in a response itself (refusing an encoding it does not know), so
the array JSON travels as a string field and this API decodes it with shmref.decode,
computes its result into a lease of its own (Client.empty), publishes it and answers with
shmref.encode, which carries a published array's descriptor without a copy. It holds its
last result until the next request (by then the client has acquired it). The shmref client
connects to $SHMREFD_SOCKET.
"""

import json

import numpy as np

from pydantic import BaseModel

from tesseract_core.runtime import Array, Float64


class InputSchema(BaseModel):
    a: Array[(None,), Float64] | None = None
    ref: str | None = None


class OutputSchema(BaseModel):
    a: Array[(None,), Float64] | None = None
    ref: str | None = None


_client = None
_last = None  # the previous shmref result, held until the client has acquired it


def _shmref():
    global _client
    import shmref

    if _client is None:
        _client = shmref.connect(timeout=30)
    return shmref, _client


def apply(inputs: InputSchema) -> OutputSchema:
    global _last
    if inputs.ref is not None:
        shmref, client = _shmref()
        if _last is not None:
            client.release(_last)
            _last = None
        a = shmref.decode(json.loads(inputs.ref), client)
        if a.nbytes <= shmref.INLINE_MAX:
            return OutputSchema(ref=json.dumps(shmref.encode(np.add(a, 1.0), client)))
        out = client.empty(a.shape, a.dtype)
        np.add(a, 1.0, out=out)
        del a
        client.publish(out)
        _last = out
        return OutputSchema(ref=json.dumps(shmref.encode(out, client)))
    return OutputSchema(a=np.add(inputs.a, 1.0))
