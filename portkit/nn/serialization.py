"""safetensors files of a module's state (through the safetensors library)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from portkit.abi import dtypes
from portkit.tensor import Tensor

# the file's dtype codes, by portkit dtype name
_CODES = {"bool": "BOOL", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
          "uint8": "U8", "uint16": "U16", "uint32": "U32", "uint64": "U64", "float16": "F16",
          "bfloat16": "BF16", "float32": "F32", "float64": "F64"}
_NAMES = {code: name for name, code in _CODES.items()}


def _safetensors():
    try:
        import safetensors
    except ImportError as error:
        raise ImportError("reading and writing .safetensors files needs the safetensors "
                          "package: pip install 'portkit[safetensors]'") from error
    return safetensors


def save_safetensors(state: dict[str, Tensor], path: str | Path,
                     metadata: dict[str, str] | None = None) -> None:
    """Writes tensors (a state_dict) and optional text metadata to a .safetensors file."""
    library = _safetensors()
    arrays = {name: np.ascontiguousarray(tensor.numpy()) for name, tensor in state.items()}
    # the specs point into `arrays`, which stays alive until the file is written
    specs = {name: library.TensorSpec(dtype=array.dtype.name, shape=array.shape,
                                      data_ptr=array.ctypes.data, data_len=array.nbytes)
             for name, array in arrays.items()}
    library.serialize_file(specs, str(path), metadata=metadata)


def load_safetensors(path: str | Path, device: str | None = None) -> dict[str, Tensor]:
    """Reads a .safetensors file into Tensors on `device` (the default device if None), by
    name; a malformed file raises safetensors' SafetensorError."""
    library = _safetensors()
    out = {}
    for name, info in library.deserialize(Path(path).read_bytes()):
        if info["dtype"] not in _NAMES:
            raise TypeError(f"load_safetensors: {name} has dtype {info['dtype']}, which portkit "
                            f"has no type for (it reads {', '.join(sorted(_NAMES))})")
        dtype = dtypes.by_name(_NAMES[info["dtype"]])
        array = np.frombuffer(info["data"], dtype.np).reshape(info["shape"])
        out[name] = Tensor(array, dtype, device)
    return out


def safetensors_metadata(path: str | Path) -> dict[str, str]:
    """The text metadata of a .safetensors file (empty if it has none)."""
    with _safetensors().safe_open(str(path), framework="numpy") as file:
        return file.metadata() or {}
