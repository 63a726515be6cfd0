# SPDX-License-Identifier: MIT
"""shmref.encode / decode: tesseract-core's array JSON with the "shmref" encoding, small
arrays inline as "base64"."""
import base64
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import shmref


def tesseract_base64(a):
    """tesseract-core's json+base64 layout, written independently of shmref."""
    return {"object_type": "array", "shape": list(a.shape), "dtype": a.dtype.name,
            "data": {"buffer": base64.b64encode(a.tobytes()).decode(), "encoding": "base64"}}


def test_layout_small_and_large(client):
    small = np.arange(10, dtype=np.float64)
    large = np.arange(100_000, dtype=np.float64)
    j = shmref.encode({"small": small, "large": large}, client)
    assert j["small"] == tesseract_base64(small)
    assert set(j["large"]) == {"object_type", "shape", "dtype", "data"}
    assert j["large"]["object_type"] == "array" and j["large"]["shape"] == [100_000]
    assert j["large"]["dtype"] == "float64" and j["large"]["data"]["encoding"] == "shmref"
    assert j["large"]["data"]["buffer"].startswith("shmref1:")
    json.dumps(j)                               # JSON-serialisable as it is
    back = shmref.decode(json.loads(json.dumps(j)), client)
    np.testing.assert_array_equal(back["small"], small)
    np.testing.assert_array_equal(back["large"], large)
    assert not back["large"].flags.writeable and not back["small"].flags.writeable


def test_threshold(client):
    at = np.zeros(shmref.INLINE_MAX // 8)
    over = np.zeros(shmref.INLINE_MAX // 8 + 1)
    assert shmref.encode(at, client)["data"]["encoding"] == "base64"
    assert shmref.encode(over, client)["data"]["encoding"] == "shmref"
    assert shmref.encode(over, client, inline_max=1 << 20)["data"]["encoding"] == "base64"
    assert shmref.encode(at, client, inline_max=0)["data"]["encoding"] == "shmref"


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "int64", "uint32", "bool", "complex128", ">f8"])
@pytest.mark.parametrize("shape", [(), (0,), (3, 4), (50_000,)])
def test_roundtrips(client, dtype, shape):
    a = (np.arange(int(np.prod(shape))) % 7).astype(dtype).reshape(shape)
    back = shmref.decode(shmref.encode({"x": [a, (a, {"y": a})]}, client), client)
    for got in (back["x"][0], back["x"][1][0], back["x"][1][1]["y"]):
        assert got.shape == a.shape and got.dtype == a.dtype.newbyteorder("=")
        np.testing.assert_array_equal(got, a)
    assert isinstance(back["x"][1], tuple)


def test_inline_codec_without_pybase64():
    """The inline path falls back to the standard library when pybase64 is absent: the
    same text, the same arrays back, and malformed base64 refused."""
    code = textwrap.dedent("""
        import sys
        sys.modules["pybase64"] = None
        import base64, numpy as np, shmref
        assert shmref._b64decode.__module__ == "shmref"
        for a in (np.arange(10.0), np.arange(12, dtype=">i4").reshape(3, 4),
                  np.asfortranarray(np.arange(6.0).reshape(2, 3)), np.array(2.5), np.zeros((0, 3))):
            j = shmref.encode(a)
            assert j["data"]["buffer"] == base64.b64encode(np.ascontiguousarray(a, a.dtype.newbyteorder("<")).tobytes()).decode()
            b = shmref.decode(j)
            assert b.shape == a.shape and (b == a).all()
        try:
            shmref.decode({"object_type": "array", "shape": [1], "dtype": "float64",
                           "data": {"buffer": "not base64!", "encoding": "base64"}})
        except Exception as e:
            print("refused", type(e).__name__)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "refused" in out.stdout


def test_inline_is_as_cheap_as_plain_base64():
    """The inline path costs about what tesseract's json+base64 costs: pybase64 when it is
    there (the test venv pins it), no per-call dtype parsing. A generous bound: this is a
    guard against a slow codec coming back, not a benchmark."""
    import timeit
    pytest.importorskip("pybase64")
    a = np.arange(1000, dtype=np.float64)

    def plain():
        j = tesseract_base64(a)
        return np.frombuffer(base64.b64decode(j["data"]["buffer"]), dtype=j["dtype"])

    def ours():
        return shmref.decode(shmref.encode(a))

    t_ours = min(timeit.repeat(ours, number=300, repeat=5))
    t_plain = min(timeit.repeat(plain, number=300, repeat=5))
    assert t_ours < 1.5 * t_plain, (t_ours, t_plain)


def test_non_arrays_pass_through(client):
    obj = {"a": 1, "b": "two", "c": [None, True, 3.5], "d": np.float64(2.5)}
    assert shmref.decode(shmref.encode(obj, client), client) == {**obj, "d": 2.5}


def test_decodes_tesseract_json(client):
    a = np.linspace(0, 1, 33)
    np.testing.assert_array_equal(shmref.decode(tesseract_base64(a), client), a)
    j = {"object_type": "array", "shape": [2, 2], "dtype": "int32", "data": {"buffer": [[1, 2], [3, 4]],
                                                                            "encoding": "json"}}
    np.testing.assert_array_equal(shmref.decode(j, client), [[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="unsupported array encoding"):
        shmref.decode({**j, "data": {"buffer": "x", "encoding": "binref"}}, client)


def test_noncontiguous_and_views(client):
    a = np.arange(200_000, dtype=np.int32).reshape(400, 500)[::3, ::2]
    np.testing.assert_array_equal(shmref.decode(shmref.encode(a, client), client), a)
    lease = client.empty(100_000, "float64")
    lease[:] = 7
    client.publish(lease)
    j = shmref.encode(lease, client)           # already published and whole: referenced, not copied
    assert j["data"]["buffer"] == str(lease.base.ref)


def test_decode_in_another_process(daemon):
    with shmref.connect(daemon.socket) as c:
        text = json.dumps(shmref.encode({"in": np.arange(1_000_000, dtype=np.float64)}, c))
    del c
    out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import json, sys, shmref
        x = shmref.decode(json.loads(sys.stdin.read()))["in"]
        print(x.dtype, x.shape[0], float(x.sum()))
        """)], input=text, capture_output=True, text=True, check=True, timeout=60,
        env={**os.environ, "SHMREFD_SOCKET": daemon.socket}).stdout.split()
    assert out == ["float64", "1000000", str(float(999_999 * 1_000_000 // 2))]
