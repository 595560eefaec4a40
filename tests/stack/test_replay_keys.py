"""The eager fast paths: a realize replays the steps of a graph of the same structure, keyed by
one walk of the graph; graphs that differ anywhere must not share a key."""
import numpy as np

from portkit import schedule
from portkit.schedule import runner
from portkit.schedule.keys import graph_key
from portkit.tensor import Tensor, realize
from portkit.view import ShapeTracker


def _put(*values) -> list[Tensor]:
    return [Tensor(np.asarray(v, np.float32)).realize() for v in values]


def test_graphs_that_differ_in_which_inputs_they_share_get_their_own_results():
    a, b = _put([1.0, 2.0, 3.0], [10.0, 20.0, 30.0])
    np.testing.assert_array_equal((a + a).numpy(), [2, 4, 6])
    np.testing.assert_array_equal((a + b).numpy(), [11, 22, 33])
    np.testing.assert_array_equal((a - b).numpy(), [-9, -18, -27])
    np.testing.assert_array_equal((b - a).numpy(), [9, 18, 27])
    # one node used twice against two equal nodes: (a + 1) * (a + 1) reads one sum
    shared = a + 1
    np.testing.assert_array_equal((shared * shared).numpy(), [4, 9, 16])
    np.testing.assert_array_equal(((a + 1) * (b + 1)).numpy(), [22, 63, 124])


def test_keys_tell_apart_graphs_with_the_same_ops_in_another_shape():
    a, b = _put([[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0], [3.0, 4.0]])
    key_sum, _ = graph_key([(a + b).lazy])
    key_transposed, _ = graph_key([(a + b.T).lazy])
    key_again, _ = graph_key([(b + a).lazy])
    assert key_sum != key_transposed
    assert key_sum == key_again
    np.testing.assert_array_equal((a + b.T).numpy(), [[2, 5], [5, 8]])


def test_keys_number_every_node_once_and_sources_by_position():
    a, = _put([1.0, 2.0])
    x = a * 2.0
    key, nodes = graph_key([(x + x).lazy])
    assert len(nodes) == len({id(n) for n in nodes}) == 4     # a, 2.0, a * 2.0, the sum
    positions = {id(n): k for k, n in enumerate(nodes)}
    for entry, node in zip(key, nodes):
        if node.src:
            assert entry[-1] == tuple(positions[id(s)] for s in node.src)


def test_reading_a_realized_tensor_again_walks_no_graph(monkeypatch):
    a, = _put([1.0, 2.0])
    out = (a * 3.0).realize()

    def walked(outs):
        raise AssertionError("a realized tensor was walked again")
    monkeypatch.setattr(runner, "graph_key", walked)
    np.testing.assert_array_equal(out.numpy(), [3, 6])
    np.testing.assert_array_equal(out.numpy(), [3, 6])


def test_realizing_a_computed_tensor_again_calls_no_scheduler(monkeypatch):
    a, = _put([1.0, 2.0])
    out = (a * 3.0).realize()

    def scheduled(outs):
        raise AssertionError("a realized tensor went to the scheduler again")
    monkeypatch.setattr(schedule, "realize", scheduled)
    assert out.realize() is out
    np.testing.assert_array_equal(out.numpy(), [3, 6])


def test_views_are_values_equal_and_hashed_alike_when_built_apart():
    one = ShapeTracker.contiguous((4, 3)).permute((1, 0))
    other = ShapeTracker.contiguous((4, 3)).permute((1, 0))
    assert one == other and hash(one) == hash(other) and one is not other
    assert one != ShapeTracker.contiguous((3, 4))
    assert not one.is_contiguous and ShapeTracker.contiguous((3, 4)).is_contiguous


def test_a_number_beside_a_tensor_keeps_torchs_dtype_and_shape():
    ints = Tensor(np.array([1, 2, 3], np.int32))
    assert (ints + 1).dtype.name == "int32"
    assert (ints * 0.5).dtype.name == "float32"
    assert (1 - ints).numpy().tolist() == [0, -1, -2]
    flags = Tensor(np.array([True, False]))
    assert (flags + 1).dtype.name == "int32"
    assert (flags + 1).numpy().tolist() == [2, 1]
    assert (Tensor(np.zeros((2, 3), np.float32)) + 1).shape == (2, 3)


def test_reductions_that_differ_in_op_or_axes_get_their_own_results():
    x, = _put([[1.0, 5.0], [3.0, 2.0]])
    np.testing.assert_array_equal(x.sum(0).numpy(), [4, 7])
    np.testing.assert_array_equal(x.amax(0).numpy(), [3, 5])
    np.testing.assert_array_equal(x.sum(1).numpy(), [6, 5])
    np.testing.assert_array_equal(x.prod(1).numpy(), [5, 6])


def test_a_replay_realizes_a_split_reduce_that_other_tensors_read():
    # A sum longer than a stage (schedule/stages.py CHUNK) is split into two reduces, in place,
    # when first scheduled; that realize leaves it a view of its last stage's buffer. A replay
    # of the same structure used to drop that buffer: a loss read after its gradients' realize
    # summed the whole row again, and portkit.jit refused the step (calls 2 and 3 launched
    # different work: ResNet-18 training at 32 x 32).
    from portkit.graph import GraphOp, toposort
    rng = np.random.default_rng(0)
    for _ in range(3):      # the first realize of the structure, then replays
        x = Tensor(rng.standard_normal((4, 40_000)).astype(np.float32))
        total = x.sum(-1)
        doubled, shifted = total * 2.0, total + 1.0     # two readers: the sum is stored
        realize(doubled, shifted)
        left = [n for n in toposort([total.lazy], stop=lambda n: n.realized)
                if n.op is GraphOp.REDUCE]
        assert not left, "the sum is computed again"
        exact = x.numpy().astype(np.float64).sum(-1)
        np.testing.assert_allclose(total.numpy(), exact, rtol=1e-5, atol=1e-3)
        np.testing.assert_allclose(doubled.numpy(), 2 * exact, rtol=1e-5, atol=2e-3)
    for _ in range(3):      # a last stage fused into its one reader: the partial sums stay
        x = Tensor(rng.standard_normal((4, 40_000)).astype(np.float32))
        total = x.sum(-1)
        (total * 2.0).realize()
        left = [n for n in toposort([total.lazy], stop=lambda n: n.realized)
                if n.op is GraphOp.REDUCE]
        assert all(n.src[0].realized and np.prod([n.src[0].shape[a] for a in n.arg[1]]) < 100
                   for n in left), "the whole row is summed again"
        exact = x.numpy().astype(np.float64).sum(-1)
        np.testing.assert_allclose(total.numpy(), exact, rtol=1e-5, atol=1e-3)
