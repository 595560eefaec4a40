"""Gather-style indexing as a GATHER (a load whose position is read from an index): values
against torch, negative indices included; an IndexError at the next read-back for an index out
of range computed on the device, eager and under portkit.jit; a gradient whose work grows with
the indices, not with the table."""
import math

import numpy as np
import pytest

import portkit
from portkit import graph, nn, optim, schedule
from portkit.nn import functional
from portkit.tensor import Tensor

torch = pytest.importorskip("torch")
RNG = np.random.default_rng(5)
TABLE = RNG.standard_normal((5, 4)).astype(np.float32)
COLUMNS = np.array([[3, -1, 0], [2, 2, -4], [0, 1, 3], [-2, 3, 1], [1, 0, 0]], np.int32)

# name: (portkit's op, torch's op, an index with negatives where the op wraps them, the op's name
# in the error, an index shape) for ops of (table, index)
OPS = {
    "getitem": (lambda x, i: x[i], lambda x, i: x[i], [4, -1, 0, -5, 2], "index"),
    "index_select": (lambda x, i: x.index_select(0, i), lambda x, i: x.index_select(0, i),
                     [4, 0, 2, 2, 1], "index_select"),
    "embedding": (lambda x, i: functional.embedding(i, x),
                  lambda x, i: torch.nn.functional.embedding(i, x), [4, 0, 2, 2, 1], "embedding"),
    "gather": (lambda x, i: x.gather(1, i), lambda x, i: x.gather(1, i), COLUMNS % 4, "gather"),
    "take_along_dim": (lambda x, i: x.take_along_dim(i, 1),
                       lambda x, i: torch.take_along_dim(x, i, 1), COLUMNS, "take_along_dim"),
}


@pytest.mark.parametrize("name", OPS)
def test_values_and_gradients_agree_with_torch(backend, name):
    ours, theirs, index, _ = OPS[name]
    index = np.asarray(index, np.int32)
    x, tx = Tensor(TABLE, requires_grad=True), torch.tensor(TABLE, requires_grad=True)
    out, ref = ours(x, Tensor(index)), theirs(tx, torch.tensor(index).long())
    np.testing.assert_array_equal(out.numpy(), ref.detach().numpy())
    weights = RNG.standard_normal(ref.shape).astype(np.float32)
    (out * Tensor(weights)).sum().backward()
    (ref * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6, atol=1e-6)


def _shifted(index: np.ndarray, by: int) -> Tensor:
    """index + by, computed on the device (the host never holds the sum)."""
    return Tensor(index).realize() + Tensor(np.int32(by)).realize()


# per op: an in-range index, and a shift that takes one of its elements out of range
@pytest.mark.parametrize("name, shift", [("getitem", 3), ("getitem", -9), ("index_select", -3),
                                         ("index_select", 4), ("embedding", 3), ("gather", 1),
                                         ("take_along_dim", -8)])
def test_an_index_out_of_range_computed_on_the_device_raises_at_the_read_back(
        backend, name, shift):
    ours, _, index, op = OPS[name]
    index = np.asarray(index, np.int32) % 4
    out = ours(Tensor(TABLE), _shifted(index, shift))       # written without error
    with pytest.raises(IndexError, match=rf"{op}: .*out of range for dimension"):
        out.numpy()
    # the flag is cleared once raised: the next read-back of good work succeeds
    good = ours(Tensor(TABLE), _shifted(index, 0))
    np.testing.assert_array_equal(good.numpy(), ours(Tensor(TABLE), Tensor(index)).numpy())


def test_gather_raises_what_torch_raises_for_a_negative_index():
    out = Tensor(TABLE).gather(0, _shifted(np.zeros((1, 4), np.int32), -1))
    with pytest.raises(RuntimeError, match="gather"):
        out.tolist()
    with pytest.raises(RuntimeError):
        torch.tensor(TABLE).gather(0, torch.full((1, 4), -1))


def test_an_index_out_of_range_in_a_jitted_function_raises_after_the_replay(backend):
    table = Tensor(TABLE).realize()

    def f(i, shift):
        return table[i + shift] * 2
    jitted = portkit.jit(f)
    index = Tensor(np.array([0, 2, 3], np.int32)).realize()
    for shift in [0, 1, 0]:              # capture, then replays
        ok = Tensor(np.int32(shift)).realize()
        np.testing.assert_array_equal(jitted(index, ok).numpy(),
                                      TABLE[np.array([0, 2, 3]) + shift] * 2)
    assert jitted.plan is not None
    bad = jitted(index, Tensor(np.int32(2)).realize())
    with pytest.raises(IndexError, match="index: .*dimension 0 with size 5"):
        bad.numpy()
    np.testing.assert_array_equal(jitted(index, Tensor(np.int32(1)).realize()).numpy(),
                                  TABLE[[1, 3, 4]] * 2)


def _embedding_step():
    rng = np.random.default_rng(3)
    embed, head = nn.Embedding(11, 6), nn.Linear(6, 11)
    for p in (embed.weight, head.weight, head.bias):
        p.assign(Tensor(rng.standard_normal(p.shape).astype(np.float32) * 0.3)).realize()
    params = [embed.weight, head.weight, head.bias]
    opt = optim.SGD(params, lr=0.1)

    def step(tokens, targets):
        opt.zero_grad()
        logits = head(embed(tokens)).reshape(-1, 11)
        loss = logits.cross_entropy(targets.reshape(-1))
        loss.backward()
        opt.step()
        return loss
    return step, params


def test_a_training_step_with_an_embedding_is_jitted_and_replays_like_eager(backend):
    batches = [(RNG.integers(0, 11, (3, 7)).astype(np.int32),
                RNG.integers(0, 11, (3, 7)).astype(np.int32)) for _ in range(5)]
    eager, eager_params = _embedding_step()
    expected = [(eager(Tensor(t), Tensor(y)).numpy(), [p.numpy() for p in eager_params])
                for t, y in batches]
    step, params = _embedding_step()
    jitted = portkit.jit(step)
    for (t, y), (loss, values) in zip(batches, expected):
        np.testing.assert_array_equal(jitted(Tensor(t).realize(), Tensor(y).realize()).numpy(),
                                      loss)
        for p, q in zip(params, values):
            np.testing.assert_array_equal(p.numpy(), q)
    assert jitted.plan is not None


def _work(tensor: Tensor) -> int:
    """The elements the kernels realizing `tensor` touch: per kernel, its outputs times the
    iterations of the reduces fused into it."""
    total = 0
    for item in schedule.schedule([tensor.lazy]):
        inputs = {id(i) for i in item.inputs}
        inside = graph.toposort([item.root], stop=lambda n, inputs=inputs: id(n) in inputs)
        loops = [math.prod(n.src[0].shape) // n.size for n in inside
                 if n.op is graph.GraphOp.REDUCE]
        total += item.root.size * max(loops, default=1)
    return total


def test_an_embedding_gradient_touches_the_indices_rows_not_the_whole_table():
    vocab, width, count = 2000, 64, 1024
    weight = Tensor(np.zeros((vocab, width), np.float32), requires_grad=True)
    tokens = Tensor(RNG.integers(0, vocab, count).astype(np.int32))
    functional.embedding(tokens, weight).sum().backward()
    # a one-hot compare summed over the indices is vocab x count x width
    assert _work(weight.grad) < vocab * count * width // 20


def test_repeated_indices_sum_their_gradients(backend):
    index = np.array([3, 3, 0, 3, 1, 0, 3], np.int32)
    x = Tensor(TABLE, requires_grad=True)
    grad = RNG.standard_normal((7, 4)).astype(np.float32)
    (x.index_select(0, Tensor(index)) * Tensor(grad)).sum().backward()
    expected = np.zeros_like(TABLE)
    np.add.at(expected, index, grad)
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-6, atol=1e-6)


def test_an_index_is_read_by_the_kernel_not_compared_with_every_row():
    tokens = Tensor(np.array([1, 4], np.int32)).realize()
    out = Tensor(TABLE).realize()[tokens]
    ops = {node.op for node in graph.toposort([out.lazy])}
    assert graph.GraphOp.GATHER in ops and graph.GraphOp.REDUCE not in ops   # no one-hot sum
    assert len(out.schedule()) == 1


def test_one_bad_index_among_many_rows_per_thread_is_found(backend):
    # threads loop over many rows here: the fault noted in the loop is stored after it
    index = RNG.integers(0, 5, 4099).astype(np.int32)
    index[2777] = 4
    table = Tensor(np.tile(TABLE, (1, 40))).realize()
    with pytest.raises(IndexError, match="index_select: .*size 5"):
        table.index_select(0, _shifted(index, 0) + (Tensor(index) == 4).cast("int32")).numpy()
    np.testing.assert_array_equal(table.index_select(0, _shifted(index, 0)).numpy(),
                                  np.tile(TABLE, (1, 40))[index])


def test_an_expanded_index_is_read_once_across_the_dims_it_is_expanded_along(backend):
    # as grid_sample and interpolate pass theirs: (n, 1, points) expanded over channels
    index = np.array([[[0, 3, 3, 1]], [[2, 2, 0, 3]]], np.int32)
    x, tx = Tensor(TABLE[None].repeat(2, 0), requires_grad=True), torch.tensor(
        TABLE[None].repeat(2, 0), requires_grad=True)
    out = x.gather(2, Tensor(index).expand(2, 5, 4))
    ref = tx.gather(2, torch.tensor(index).long().expand(2, 5, 4))
    assert out.lazy.src[1].shape == (2, 1, 4)
    np.testing.assert_array_equal(out.numpy(), ref.detach().numpy())
    weights = RNG.standard_normal((2, 5, 4)).astype(np.float32)
    (out * Tensor(weights)).sum().backward()
    (ref * torch.tensor(weights)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-6, atol=1e-6)
