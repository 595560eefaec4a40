"""DType equality and hashing: by fields, as a dataclass's, with the hash made once; a pickle
rebuilds it from its fields (a str hash differs between processes)."""
import os
import pickle
import subprocess
import sys

from portkit.abi import dtypes


def test_dtypes_with_equal_fields_are_equal_and_hash_alike():
    twin = dtypes.DType("float32", 4, "float")
    assert twin == dtypes.float32 and hash(twin) == hash(dtypes.float32)
    assert twin in {dtypes.float32} and twin in frozenset(dtypes.ALL)
    assert dtypes.float32 != dtypes.int32 and dtypes.float16 != dtypes.bfloat16
    assert dtypes.float32 != "float32" and len(set(dtypes.ALL)) == len(dtypes.ALL)


def test_a_pickled_dtype_hashes_as_the_receiving_process_does():
    data = pickle.dumps(dtypes.float64)
    code = ("import pickle, sys; from portkit.abi import dtypes; "
            "d = pickle.loads(sys.stdin.buffer.read()); "
            "print(d == dtypes.float64, d in {dtypes.float64})")
    out = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True,
                         check=True, env={**os.environ, "PYTHONHASHSEED": "random"})
    assert out.stdout.split() == [b"True", b"True"]
