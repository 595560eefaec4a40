"""Compositions (portkit/tensor/composition.py): a copied recording is the very graph the
Tensor ops build, for any shape, and a build that is not elementwise is never copied."""
import numpy as np
import pytest

from portkit.abi import dtypes
from portkit.schedule.keys import graph_key
from portkit.tensor import Tensor
from portkit.tensor.composition import Composition
from portkit.tensor.exponential import _exp


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_copied_exp_is_the_graph_the_tensor_ops_build(dtype):
    exp = Composition(_exp)
    exp(Tensor(np.ones((2, 3), dtype)).realize())            # recorded at one shape
    for shape in [(2, 3), (7,), (), (4, 1, 5)]:
        x = Tensor(np.linspace(-90, 90, int(np.prod(shape)), dtype=dtype).reshape(shape))
        x.realize()
        built, copied = _exp(x), exp(x)
        assert copied.lazy is not built.lazy and copied.shape == shape
        assert graph_key([copied.lazy])[0] == graph_key([built.lazy])[0]
        np.testing.assert_array_equal(copied.numpy(), built.numpy())


def test_a_build_with_a_reduce_or_a_view_is_built_every_time():
    calls = []

    def softmax_sum(x):
        calls.append(x.shape)
        return x.exp() / x.exp().sum()

    composed = Composition(softmax_sum)
    for n in (3, 5):
        out = composed(Tensor(np.arange(n, dtype=np.float32)).realize())
        np.testing.assert_allclose(out.numpy(), np.exp(np.arange(n)) / np.exp(np.arange(n)).sum(),
                                   rtol=1e-6)
    assert calls == [(3,), (5,)]


def test_an_empty_operand_is_built_by_the_tensor_ops():
    exp = Composition(_exp)
    exp(Tensor(np.ones(3, np.float32)).realize())
    assert exp(Tensor(np.ones((0, 2), np.float32))).shape == (0, 2)


def test_a_recording_shares_the_nodes_the_build_shares():
    def build(x):
        doubled = x * 2
        return doubled * doubled + doubled
    composed = Composition(build)
    composed(Tensor(np.ones(4, np.float32)).realize())
    x = Tensor(np.arange(6, dtype=np.float32)).realize()
    copied = composed(x)
    assert graph_key([copied.lazy])[0] == graph_key([build(x).lazy])[0]
    np.testing.assert_array_equal(copied.numpy(), (np.arange(6) * 2) ** 2 + np.arange(6) * 2)
    same = Composition(lambda x: x)
    same(x)
    assert same(x).lazy is x.lazy



def test_copies_and_ops_share_their_constant_nodes():
    # a step's graph held thousands of constant nodes of a few dozen values, each numbered and
    # keyed at every realize
    from portkit.graph import GraphOp, toposort
    a = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    x = Tensor(a).realize()
    one = x.exp()
    y = x
    for _ in range(10):
        y = (y * 0.5 - 1.0).exp()
    constants = [n for n in toposort([y.lazy, one.lazy]) if n.op is GraphOp.CONST]
    assert len(constants) == len({(n.arg, n.dtype) for n in constants})
    assert len(constants) <= len([n for n in toposort([one.lazy]) if n.op is GraphOp.CONST]) + 2
    want = a
    for _ in range(10):
        want = np.exp(want * np.float32(0.5) - np.float32(1.0))
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5)


def test_a_where_of_two_numbers_takes_shared_constants():
    # a where of two numbers made them full tensors, nodes of their own: exp's first call,
    # which records exp, and each copy after it held the same constants twice
    from portkit.graph import GraphOp, toposort
    x = Tensor(np.arange(-2, 2, dtype=np.float32)).realize()
    a, b = (x < 0)._where(-0.5, 0.5), (x > 0)._where(-0.5, 0.5)
    constants = [n for n in toposort([a.lazy, b.lazy]) if n.op is GraphOp.CONST]
    assert sorted(n.arg for n in constants) == [-0.5, 0.0, 0.5]
    np.testing.assert_array_equal(a.numpy(), [-0.5, -0.5, 0.5, 0.5])
    np.testing.assert_array_equal(b.numpy(), [0.5, 0.5, 0.5, -0.5])


def test_a_full_table_of_constants_keeps_the_graph_being_built_shared(monkeypatch):
    # the table of shared constants was emptied whole at its bound: a graph built across that
    # moment held two nodes of one constant, depending on what ran in the process before
    from portkit import graph
    for _ in range(2):              # exp recorded, then its constants at (3, 4) kept
        Tensor(np.ones((3, 4), np.float32)).realize().exp()
    monkeypatch.setattr(graph, "_MAX_SHARED", len(graph._shared) + 64)
    for k in range(65):             # to the bound, and one past it
        graph.shared_const(k + 0.25, dtypes.float32, (1,), "cpu")
    test_copies_and_ops_share_their_constant_nodes()


def test_copies_at_one_shape_look_their_constants_up_once(monkeypatch):
    from portkit import graph
    from portkit.tensor import composition
    asked: list[object] = []

    def counting(value, dtype, shape, device):
        asked.append(value)
        return graph.shared_const(value, dtype, shape, device)
    monkeypatch.setattr(composition, "shared_const", counting)
    exp = Composition(_exp)
    exp(Tensor(np.ones(5, np.float32)).realize())            # recorded
    xs = [Tensor(np.full(7, k, np.float32)).realize() for k in range(4)]
    copies = [exp(x) for x in xs]
    constants = len(asked)
    assert 0 < constants == len({(n.arg, n.dtype) for n in graph.toposort([copies[0].lazy])
                                 if n.op is graph.GraphOp.CONST})
    for k, copied in enumerate(copies):
        np.testing.assert_array_equal(copied.numpy(), _exp(xs[k]).numpy())


@pytest.mark.parametrize("name", ["sigmoid", "tanh"])
def test_sigmoid_and_tanh_copy_their_value_and_derivative(name, monkeypatch):
    # an LSTM step runs 175 of them: each was 10-30 Tensor ops with promotion and broadcasting
    torch = pytest.importorskip("torch")
    a = np.linspace(-9, 9, 24, dtype=np.float32).reshape(4, 6)
    getattr(Tensor(a), name)()                                # recorded
    ran: list[str] = []
    primitive = Tensor._prim

    def counting(self, op, *others, **kwargs):
        ran.append(op)
        return primitive(self, op, *others, **kwargs)
    monkeypatch.setattr(Tensor, "_prim", counting)
    x = Tensor(a * 0.5, requires_grad=True)
    y = getattr(x, name)()
    assert ran == ["given_grad"]
    y.sum().backward()
    want = torch.tensor(a * 0.5, requires_grad=True)
    getattr(want, name)().sum().backward()
    np.testing.assert_allclose(y.numpy(), getattr(want, name)().detach().numpy(), rtol=1e-6,
                               atol=1e-7)
    np.testing.assert_allclose(x.grad.numpy(), want.grad.numpy(), rtol=1e-5, atol=1e-7)
