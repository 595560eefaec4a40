"""batch_norm when training (portkit/tensor/batchnorm.py): its given gradients against PyTorch's,
with and without a weight and a bias, and the passes over the activation they take."""
import pytest

from portkit import schedule
from portkit.graph import GraphOp, toposort
from portkit.nn import functional as F
from portkit.tensor import Tensor

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("backend")
TF = torch.nn.functional


@pytest.mark.parametrize("shape", [(4, 3, 5), (3, 4, 2, 5)])
@pytest.mark.parametrize("affine", ["both", "weight", "bias", "none"])
def test_a_training_batch_norm_gives_torchs_gradients(shape, affine, check, data):
    x, w, b = data(*shape) * 2 + 1, data(shape[1]), data(shape[1])
    weighted, biased = affine in ("both", "weight"), affine in ("both", "bias")

    def call(x, w, b):
        lib = F if isinstance(x, Tensor) else TF
        return lib.batch_norm(x, None, None, w if weighted else None, b if biased else None,
                              True, 0.1, 1e-3) * (x * 0 + 1.5 + x.cos())
    check(call, x, w, b, atol=1e-4)


def test_a_training_batch_norm_takes_two_sums_of_the_activation_each_way(data):
    # forward: the mean, and the variance from it; backward: the output gradient's sum and its
    # sum times the normalized input. Derived through the statistics (and input.var's mean
    # of its own) it took eight.
    x = Tensor(data(4, 8, 6, 6), requires_grad=True)
    w, b = Tensor(data(8), requires_grad=True), Tensor(data(8), requires_grad=True)
    y = F.batch_norm(x, None, None, w, b, training=True)
    (y * Tensor(data(4, 8, 6, 6))).sum().backward()
    items = schedule.create_schedule([y.lazy, x.grad.lazy, w.grad.lazy, b.grad.lazy])
    sums = [node for item in items for node in toposort(
        [item.root], stop=lambda node, item=item: any(node is i for i in item.inputs))
            if node.op is GraphOp.REDUCE and node.src[0].size == x.numel()]
    assert len(sums) == 4, len(sums)
