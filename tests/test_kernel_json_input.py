"""The validator and Kernel.from_json refuse what is not a kernel of this ABI, in one line
(issue 11, item 10)."""
from __future__ import annotations

import json

import pytest

from portkit.abi import InvalidKernel, Kernel, KernelBuilder, dtypes


@pytest.mark.parametrize("damage, message", [
    (lambda d: d.update(nodes=[]), "stores nothing"),
    (lambda d: d["nodes"][0].update(arg=True), "PARAM"),
    (lambda d: d.update(name=7), "name must be a non-empty string"),
    (lambda d: d.update(abi_version="9.9"), "ABI '9.9'"),
    (lambda d: d["nodes"][0].pop("op"), "missing key 'op'"),
    (lambda d: d["nodes"][1].update(src=5), "not a kernel's JSON"),
], ids=["empty", "param true", "integer name", "abi version", "no op", "src not a list"])
def test_from_json_refuses_what_is_not_a_kernel_in_one_line(damage, message):
    k = KernelBuilder("small")
    out = k.param(dtypes.float32)
    k.store(out, k.special("group", 0), k.const(1.0, dtypes.float32))
    data = json.loads(k.build(grid=(2, 1, 1), block=(1, 1, 1)).to_json())
    damage(data)
    with pytest.raises(InvalidKernel, match=message) as error:
        Kernel.from_json(json.dumps(data))
    assert "\n" not in str(error.value)
