# SPDX-License-Identifier: MIT
"""A no-op Tesseract for the Python benchmark: apply returns its input.

`a` is an ordinary tesseract-core Array field, moved by whatever the client asks for
(json+base64, json+binref, the binref pool). `ref` carries the same array as shmref's
array JSON (shmref.encode output, encoding "shmref", as JSON text): tesseract-core 1.15
has no hook for a new array encoding, and its client decodes every dict with
object_type "array" in a response itself (refusing an encoding it does not know), so
the array JSON travels as a string field and this API decodes it with shmref.decode and
encodes its result with shmref.encode, which forwards an acquired array's descriptor
without a copy. Its holder must keep such an array alive until the peer acquired it, so
this API holds its last result until the next request. The shmref client connects to
$SHMREFD_SOCKET.
"""

import json

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
        _last = None
        _last = arr = shmref.decode(json.loads(inputs.ref), client)
        return OutputSchema(ref=json.dumps(shmref.encode(arr, client)))
    return OutputSchema(a=inputs.a)
