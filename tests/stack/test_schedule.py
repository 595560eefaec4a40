"""Fusion is visible in Tensor.schedule(), and training layers and optimizers work."""
import numpy as np
import pytest

import portkit
from portkit import nn, optim, schedule
from portkit.abi.ops import Op
from portkit.graph import GraphOp
from portkit.tensor import Tensor


def test_elementwise_chain_and_reduce_are_one_kernel():
    a, b, c = (Tensor(np.random.rand(4, 8).astype(np.float32)) for _ in range(3))
    out = ((a * b + c).relu()).sum(axis=1)
    kernels = out.schedule()
    assert len(kernels) == 1
    # one kernel reads a, b and c and writes the sums, in a loop over the reduce
    assert sum(n.op is Op.PARAM for n in kernels[0].nodes) == 4
    assert any(n.op is Op.RANGE for n in kernels[0].nodes)
    assert {Op.MUL, Op.ADD, Op.WHERE} <= {n.op for n in kernels[0].nodes}
    expected = np.maximum(a.numpy() * b.numpy() + c.numpy(), 0).sum(1)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)


def test_movement_ops_cost_no_kernel():
    a = Tensor(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
    view = a.permute(2, 0, 1).pad(((1, 1), (0, 0), (0, 0))).flip(0)[1:, :, ::2] * 2
    assert len(view.schedule()) == 1
    ref = np.pad(a.numpy().transpose(2, 0, 1), ((1, 1), (0, 0), (0, 0)))[::-1][1:, :, ::2] * 2
    np.testing.assert_array_equal(view.numpy(), ref)


def test_mlp_forward_backward_kernel_count():
    l1, l2 = nn.Linear(8, 16), nn.Linear(16, 4)
    x = Tensor(np.random.rand(5, 8).astype(np.float32))
    y = Tensor(np.array([0, 1, 2, 3, 0], np.int32))
    loss = l2(l1(x).relu()).cross_entropy(y)
    loss.backward()
    grads = [p.grad for p in (l1.weight, l1.bias, l2.weight, l2.bias)]
    from portkit import schedule
    items = schedule.create_schedule([loss.lazy] + [g.lazy for g in grads])
    # 2 forward matmuls + 3 backward matmuls + 2 bias-grad sums + max/sum of log-softmax + mean,
    # the logits' gradient, which three kernels read (it reads 5 buffers: limits.py), and a
    # (5, 4) product inside it that two kernels read, stored once MAX_SHARED_DEPTH ops deep
    assert len(items) <= 14, len(items)


def test_sgd_momentum_matches_torch_rule():
    w = Tensor(np.array([1.0, -2.0], np.float32), requires_grad=True)
    opt = optim.SGD([w], lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)
    for _ in range(2):
        opt.zero_grad()
        (w * w).sum().backward()
        opt.step()
    # reference computed by hand with torch's formulas
    p, buf = np.array([1.0, -2.0]), None
    for _ in range(2):
        g = 2 * p + 0.01 * p
        buf = g if buf is None else 0.9 * buf + g
        p = p - 0.1 * (g + 0.9 * buf)
    np.testing.assert_allclose(w.numpy(), p, rtol=1e-5)


def test_adam_decreases_loss_and_state_dict_round_trips(tmp_path):
    model = nn.Linear(3, 1)
    opt = optim.AdamW(model.parameters(), lr=0.05)
    x = Tensor(np.random.rand(16, 3).astype(np.float32))
    y = Tensor((np.random.rand(16, 1) > 0.5).astype(np.float32))
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    nn.save_safetensors(model.state_dict(), tmp_path / "m.safetensors")
    other = nn.Linear(3, 1)
    other.load_state_dict(nn.load_safetensors(tmp_path / "m.safetensors"))
    np.testing.assert_array_equal(other.weight.numpy(), model.weight.numpy())


def test_conv_batchnorm_layernorm_embedding_layers():
    x = Tensor(np.random.rand(2, 3, 6, 6).astype(np.float32))
    conv, bn = nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)
    out = bn(conv(x))
    assert out.shape == (2, 4, 6, 6)
    np.testing.assert_allclose(out.numpy().mean((0, 2, 3)), 0, atol=1e-4)
    ln = nn.LayerNorm(6)
    np.testing.assert_allclose(ln(x).numpy().std(-1), 1, atol=1e-2)
    emb = nn.Embedding(10, 4)
    assert emb(Tensor([[1, 2]])).shape == (1, 2, 4)


def test_long_reduce_into_few_outputs_splits_across_groups():
    x = np.random.default_rng(0).standard_normal(1 << 17).astype(np.float32)
    kernels = Tensor(x, device="cpu").sum().schedule()
    # partial sums of 32 slices of 4096 (16384 elements per group), then a reduce of those 32
    assert [k.name for k in kernels] == ["r_32_1", "r"]
    assert kernels[0].grid[0] == 8 and kernels[1].grid[0] == 1
    got = float(Tensor(x, device="cpu").sum().numpy())
    bound = x.size * np.finfo(np.float32).eps * np.abs(x).astype(np.float64).sum()
    assert abs(got - x.astype(np.float64).sum()) <= bound
    ints = np.arange(1 << 16, dtype=np.int32).reshape(4, 1 << 14)
    np.testing.assert_array_equal(Tensor(ints, device="cpu").max(axis=None).numpy(), ints.max())
    summed = Tensor(ints, device="cpu").sum(axis=1)
    np.testing.assert_array_equal(summed.numpy(), ints.sum(1, dtype=np.int32))


def test_long_reduce_on_hardware_lanes_splits_into_interleaved_partial_sums():
    """A device whose threads are lanes (the interpreter stands for a GPU) gets thousands of
    partial sums, partial j adding elements j, j + parts, ...: neighbouring threads read
    neighbouring elements. The CPU's split (contiguous slices) ran an H200 at 29 GB/s."""
    x = np.random.default_rng(1).standard_normal(1 << 17).astype(np.float32)
    items = schedule.schedule([Tensor(x, device="interpreter").sum().lazy])
    first = items[0].root
    # interleaved slices of 16 terms: 8192 partial sums, then 512, then their sum
    assert first.size == 8192 and [i.root.size for i in items[1:]] == [512, 1]
    # the first stage reads x as (16, 8192) and sums the leading axis: coalesced
    assert first.op is GraphOp.REDUCE and first.arg[1] == (0,)
    assert first.src[0].op is GraphOp.VIEW and first.src[0].shape == (16, 8192)
    got = float(Tensor(x, device="interpreter").sum().numpy())
    bound = x.size * np.finfo(np.float32).eps * np.abs(x).astype(np.float64).sum()
    assert abs(got - x.astype(np.float64).sum()) <= bound
    # odd lengths pad with the reduce's identity; products keep the tiled split
    ints = np.arange(3 * 5003, dtype=np.int32).reshape(3, 5003) - 7000
    for name, want in (("sum", ints.sum(1)), ("amax", ints.max(1)), ("amin", ints.min(1)),
                       ("prod", np.sign(ints).prod(1))):
        source = np.sign(ints) if name == "prod" else ints
        got = getattr(Tensor(source, device="interpreter"), name)(axis=1).numpy()
        np.testing.assert_array_equal(got, want)


def test_a_matrix_vector_product_on_hardware_lanes_splits_its_depth_ahead_of_the_outputs():
    """A GPT-2 decode step's (1, 3072) @ (3072, 768) ran on an H200 as one group of 192
    threads, each adding 3072 terms (0.72 ms). On lanes it is cut into contiguous slices of K
    whose partial sums lead the outputs, so thread (slice, n) reads row k of the weight beside
    thread (slice, n + 1); a matmul of many outputs keeps one stage for its tiled lowering."""
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((1, 3072), np.float32), rng.standard_normal((3072, 768),
                                                                         np.float32)
    product = Tensor(x, device="interpreter") @ Tensor(w, device="interpreter")
    first, second = (i.root for i in schedule.schedule([product.lazy]))
    assert first.shape[0] == 128 and first.shape[-2:] == (768, 1)
    assert second.size == 768
    np.testing.assert_allclose(product.numpy(), x @ w, rtol=1e-4, atol=1e-3)
    batched = rng.standard_normal((3, 2, 3072), np.float32)
    np.testing.assert_allclose((Tensor(batched, device="interpreter")
                                @ Tensor(w, device="interpreter")).numpy(), batched @ w,
                               rtol=1e-4, atol=1e-3)
    a = np.ones((128, 4096), np.float32)
    (matmul,) = [i.root for i in schedule.schedule(
        [(Tensor(a, device="interpreter") @ Tensor(a[:64].T.copy(), device="interpreter")).lazy])]
    assert matmul.shape == (128, 64)


DEEP_CHAIN = """
import sys
from portkit.tensor import Tensor
x0 = Tensor([[1.0, 2.0], [3.0, 4.0]], device=sys.argv[1], requires_grad=True)
x = x0
for i in range(int(sys.argv[2])):
    x = x + 1 if sys.argv[3] == "add" else (x + 1).T
print(x.numpy().ravel().tolist())
x.sum().backward()
print(x0.grad.numpy().ravel().tolist())
"""


def _deep_chain(device: str, length: int, kind: str) -> list[str]:
    import subprocess
    import sys

    ran = subprocess.run([sys.executable, "-c", DEEP_CHAIN, device, str(length), kind],
                         check=False, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-2000:]
    return ran.stdout.splitlines()


@pytest.mark.parametrize("kind", ["add", "transpose"])
def test_a_chain_of_20000_ops_runs_forward_and_backward(backend, kind):
    """20,000 chained adds segfaulted on cpu and opencl: a recursive walk of the fused kernel
    overflowed the C stack. Kernels now fuse at most MAX_FUSED_DEPTH ops along a path."""
    n = 20_000      # an even number of transposes leaves the layout as it was
    want = [1.0 + n, 2.0 + n, 3.0 + n, 4.0 + n]
    assert _deep_chain(backend, n, kind) == [str(want), str([1.0] * 4)]


@pytest.mark.slow
def test_a_chain_of_100000_adds_runs_forward_and_backward():
    n = 100_000
    assert _deep_chain("cpu", n, "add") == [str([1.0 + n, 2.0 + n, 3.0 + n, 4.0 + n]),
                                            str([1.0] * 4)]


def test_a_deep_chain_is_cut_into_kernels_of_bounded_depth():
    from portkit.schedule.limits import MAX_FUSED_DEPTH

    x = Tensor(np.zeros(4, np.float32))
    for _ in range(2 * MAX_FUSED_DEPTH + 500):
        x = x + 1
    assert len(x.schedule()) == 3
    assert x.numpy().tolist() == [2 * MAX_FUSED_DEPTH + 500.0] * 4


def test_a_kernel_output_past_the_int32_index_range_is_refused_before_allocating():
    from portkit.graph import TooLarge

    wide = Tensor.zeros(1).expand(2**31) + 1       # written as a view, refused at realize
    with pytest.raises(TooLarge, match="2,147,483,648 elements"):
        wide.realize()


def test_a_tensor_past_the_devices_largest_buffer_is_refused_before_allocating(
        backend, monkeypatch):
    import dataclasses

    from portkit import graph, runtime
    from portkit.graph import TooLarge

    rt = runtime.get(backend)
    small = dataclasses.replace(rt.device.capabilities, max_buffer_bytes=1024)
    monkeypatch.setattr(rt, "device", dataclasses.replace(rt.device, capabilities=small))
    allocations = []
    alloc = rt.device.allocator.alloc
    monkeypatch.setattr(rt.device.allocator, "alloc", lambda *a: allocations.append(a) or
                        alloc(*a))
    assert (Tensor.ones(256) * 2).numpy().tolist() == [2.0] * 256      # 1,024 bytes fit
    allocations.clear()
    with pytest.raises(TooLarge, match=f"device '{backend}' allocates at most 1,024 per buffer"):
        (Tensor.ones(257) * 2).realize()
    assert allocations == []

    # Host data too (an ONNX initializer, a Tensor made from numpy): GPT-2's 154 MB embedding
    # reached WebGPU, whose 128 MiB binding limit wgpu enforced with a validation error. Past
    # the limit it is uploaded in blocks that fit, which kernels read through a lazy cat.
    table = np.arange(600 * 2, dtype=np.float32).reshape(600, 2)
    split = Tensor(table, device=backend)
    blocks = [node for node in graph.toposort([split.lazy]) if node.op is graph.GraphOp.LOAD]
    assert sorted(node.size * 4 for node in blocks) == [704, 1024, 1024, 1024, 1024]
    rows = Tensor(np.array([0, 599, 128, 127, 300], np.int32), device=backend)
    assert split[rows].numpy().tolist() == table[[0, 599, 128, 127, 300]].tolist()
    assert split.sum().item() == table.sum()
    weights = np.linspace(0, 1, 600, dtype=np.float32).reshape(600, 1)
    product = (split.T @ Tensor(weights, device=backend)).numpy()
    assert np.allclose(product, table.T @ weights, rtol=1e-6)
    with pytest.raises(TooLarge, match=r"shape \(600, 2\) takes 4,800 bytes"):
        split.realize()                 # whole, it is still one buffer too many bytes
    with pytest.raises(TooLarge, match=r"shape \(257,\) takes 1,028 bytes"):
        Tensor(np.ones((1, 257), np.float32), device=backend).reshape(257).realize()


def test_webgpu_declares_its_binding_limit():
    from portkit import backends

    if backends.available().get("webgpu") is not None:
        pytest.skip("webgpu does not load here")
    from portkit import runtime
    from portkit.graph import TooLarge

    limit = runtime.get("webgpu").capabilities.max_buffer_bytes
    assert limit is not None and limit >= 2**27        # WebGPU guarantees 128 MiB
    with pytest.raises(TooLarge, match="Capabilities.max_buffer_bytes"):
        Tensor.zeros(limit // 4 + 1, device="webgpu").realize()


def _lstm_kernels(steps: int, batch: int = 2, hidden: int = 8):
    """The schedule of an LSTM's recurrence over `steps`, with its output and numpy's."""
    from portkit import graph, schedule
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((steps, batch, 4 * hidden)).astype(np.float32)
    rs = (rng.standard_normal((4 * hidden, hidden)) * 0.3).astype(np.float32)
    x, r = Tensor(xs), Tensor(rs)
    h = c = Tensor.zeros(batch, hidden)
    ref_h = ref_c = np.zeros((batch, hidden), np.float32)
    outs, refs = [], []
    sig = lambda v: 1 / (1 + np.exp(-v))
    for t in range(steps):
        g, ref_g = x[t] + h @ r.T, xs[t] + ref_h @ rs.T
        i, o, f, cell = (g[:, k * hidden:(k + 1) * hidden] for k in range(4))
        ri, ro, rf, rcell = (ref_g[:, k * hidden:(k + 1) * hidden] for k in range(4))
        c = f.sigmoid() * c + i.sigmoid() * cell.tanh()
        ref_c = sig(rf) * ref_c + sig(ri) * np.tanh(rcell)
        h, ref_h = o.sigmoid() * c.tanh(), sig(ro) * np.tanh(ref_c)
        outs.append(h)
        refs.append(ref_h)
    y = portkit.stack(outs)
    items = schedule.create_schedule([y.lazy])
    sizes = [len(graph.toposort([it.root], stop=lambda n, it=it: n is not it.root and (
        n.realized or any(n is s for s in it.inputs)))) for it in items]
    return items, sizes, y, np.stack(refs)


def test_a_recurrence_is_not_recomputed_in_every_later_step():
    """An LSTM's cell state is read by the next step and by the output: fused into every
    reader, each step's kernels recomputed all the steps before it (O(steps^2) work, kernels
    growing with the sequence, a 16-step LSTM's first call over 10 minutes)."""
    short, short_sizes, _, _ = _lstm_kernels(8)
    long, long_sizes, y, ref = _lstm_kernels(16)
    # no kernel grows with the sequence but the last, the stack of every step's h, which
    # reads one more input per step and grows by those reads alone
    assert max(long_sizes[:-1]) == max(short_sizes[:-1])
    assert long_sizes[-1] - short_sizes[-1] <= 4 * (len(long[-1].inputs) - len(short[-1].inputs))
    assert len(long) <= 2 * len(short) + 2
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-6)


def _exponentials(item) -> int:
    """The exponentials kernel `item` computes: each rounds x / ln2 to an integer k, a CAST
    from a float to an int (tensor/exponential.py `_exp`)."""
    from portkit import graph
    return sum(n.op is Op.CAST and n.src[0].dtype.is_float and not n.dtype.is_float
               for n in graph.toposort([item.root], stop=lambda n: n is not item.root and any(
                   n is s for s in item.inputs)))


def test_a_sigmoid_read_by_two_kernels_is_computed_once():
    """A sigmoid is 25 fused ops deep, past MAX_SHARED_DEPTH: two kernels that read it (an
    LSTM's gate gradients read each gate's) read one buffer, and its exponential runs once."""
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((6, 8)).astype(np.float32)
    gate = Tensor(xs).sigmoid()
    rows, columns = gate.sum(axis=1), gate.sum(axis=0)
    items = schedule.create_schedule([rows.lazy, columns.lazy])
    assert sum(_exponentials(it) for it in items) == 1, items
    ref = 1 / (1 + np.exp(-xs))
    np.testing.assert_allclose(rows.numpy(), ref.sum(1), rtol=1e-5)
    np.testing.assert_allclose(columns.numpy(), ref.sum(0), rtol=1e-5)


def test_costly_matmul_operand_gets_its_own_kernel():
    # ViT's MLP: a GELU between two linears. Fused into the second matmul, the GELU ran again
    # for every panel of that matmul's columns (12 times per element at ViT-S's 384); with its
    # own buffer it runs once and the matmul reads a plain operand.
    rng = np.random.default_rng(0)
    x, w1, b1, w2 = (Tensor(rng.standard_normal(s, dtype=np.float32))
                     for s in ((8, 32), (32, 64), (64,), (64, 64)))
    from portkit import schedule
    items = schedule.create_schedule([((x @ w1 + b1).gelu() @ w2).lazy])
    assert len(items) == 3, items
    gelu, matmul = items[1], items[2]
    assert gelu.root in matmul.inputs and len(matmul.inputs) == 2


def test_cheap_matmul_operand_stays_fused():
    rng = np.random.default_rng(0)
    x, w1, b1, w2 = (Tensor(rng.standard_normal(s, dtype=np.float32))
                     for s in ((8, 32), (32, 64), (64,), (64, 64)))
    from portkit import schedule
    assert len(schedule.create_schedule([((x @ w1 + b1).relu() @ w2).lazy])) == 2


def _residual_kernels(blocks: int) -> list:
    """The kernels of `blocks` pre-norm residual blocks (x + f(norm(x)), ViT's and GPT-2's)."""
    from portkit import schedule
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((5, 16), dtype=np.float32))
    for _ in range(blocks):
        norm1, norm2, attn, mlp = nn.LayerNorm(16), nn.LayerNorm(16), nn.Linear(16, 16), \
            nn.Linear(16, 16)
        x = x + attn(norm1(x))
        x = x + mlp(norm2(x).gelu())
    return schedule.create_schedule([x.lazy])


def test_a_residual_stream_is_stored_once_per_block():
    # Unstored, the stream x + y1 + y2 + ... was a few ops per block, under the shared depth
    # bound for 8 blocks: each block's layer norm statistics read every earlier block's
    # outputs (an 8-block ViT's last ones 38 buffers), and each block compiled kernels of its own.
    from portkit.schedule.keys import structure_key
    four, eight = _residual_kernels(4), _residual_kernels(8)
    per_block = (len(eight) - len(four)) // 4
    assert len(eight) - len(four) == 4 * per_block and len(four) <= 4 * per_block + 2
    assert max(len(item.inputs) for item in eight) <= 9
    keys = [structure_key(item.root, item.inputs) for item in eight]
    # past the first block, each block's kernels are the one before's
    assert keys[2 * per_block:3 * per_block] == keys[3 * per_block:4 * per_block]


def test_a_sum_of_matmuls_is_not_one_naive_kernel():
    """A weight used at every step of a recurrence gets one gradient per step, summed: fused
    into one kernel, the 35 products of an LSTM's hidden weight ran as plain loops (no packed
    panels), half of its training step. Each product is its own matmul kernel."""
    from portkit import graph, schedule
    from portkit.graph import GraphOp
    rng = np.random.default_rng(0)
    pairs = [(Tensor(rng.standard_normal((4, 32), dtype=np.float32)),
              Tensor(rng.standard_normal((4, 16), dtype=np.float32))) for _ in range(5)]
    total = pairs[0][0].T @ pairs[0][1]
    for a, b in pairs[1:]:
        total = total + a.T @ b
    items = schedule.create_schedule([total.lazy])
    reduces = [sum(n.op is GraphOp.REDUCE for n in graph.toposort(
        [it.root], stop=lambda n, it=it: n is not it.root and any(n is s for s in it.inputs)))
        for it in items]
    assert max(reduces) == 1, reduces
    expected = sum(a.numpy().T @ b.numpy() for a, b in pairs)
    np.testing.assert_allclose(total.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_a_cat_wider_than_a_kernel_splits_into_few_kernels():
    """A cat sums its padded pieces. As a chain of adds, a cat of more pieces than a kernel may
    read split one piece per round: an LSTM's output over 200 steps (64 buffers per kernel)
    became 138 kernels, each compiled and each writing the whole output. As a balanced tree
    it splits in halves: 4 kernels of 50 pieces and 3 that add two halves."""
    from portkit import schedule
    pieces = [Tensor(np.full((2, 3), k, np.float32)) for k in range(200)]
    out = portkit.stack(pieces)
    items = schedule.schedule([out.lazy])
    assert len(items) == 7, len(items)
    assert max(len(item.inputs) for item in items) == 50
    np.testing.assert_array_equal(out.numpy(), np.stack([p.numpy() for p in pieces]))


def test_a_costly_activation_read_by_two_kernels_is_computed_once():
    # EfficientNet's squeeze-excite: SiLU(depthwise conv) is read by the pool's mean and by
    # the gate's multiply. Fused into each, its exponential ran in both; with a buffer of its
    # own, the pool sums a buffer and the multiply reads it.
    import torch
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s, dtype=np.float32) for s in ((1, 8, 12, 12), (8, 1, 3, 3),
                                                                    (8,)))
    y = Tensor(x).conv2d(Tensor(w), Tensor(b), padding=1, groups=8)
    act = y * y.sigmoid()
    out = act * act.mean(axis=(2, 3), keepdim=True).sigmoid()
    items = schedule.create_schedule([out.lazy])
    conv = next(i for i in items if i.root.op is GraphOp.REDUCE and i.root.shape[-1] == 1
                and len(i.root.shape) > 4)
    silu, = (i for i in items if i.root.op is Op.MUL and conv.root in i.inputs)
    pool, = (i for i in items if i.root.op is GraphOp.REDUCE and i.root.shape == (1, 8, 1, 1))
    assert pool.inputs == [silu.root] and silu.root in items[-1].inputs, items
    act_ref = torch.nn.functional.silu(torch.nn.functional.conv2d(
        torch.tensor(x), torch.tensor(w), torch.tensor(b), padding=1, groups=8))
    ref = act_ref * act_ref.mean((2, 3), keepdim=True).sigmoid()
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)


def test_softmax_exponential_runs_once():
    """exp is 17 fused ops deep, MAX_SHARED_DEPTH: softmax's exp(x - max), read by the sum
    and by the division, is stored once, not computed in both (its exponential cost 0.9 ms
    of a 560 x 2000 softmax's 2.4, one thread)."""
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((6, 40)).astype(np.float32)
    out = Tensor(xs).softmax(-1)
    items = schedule.create_schedule([out.lazy])
    assert sum(_exponentials(it) for it in items) == 1, items
    ref = np.exp(xs - xs.max(-1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), ref / ref.sum(-1, keepdims=True), rtol=1e-5)


def _gate_kernels(first: slice, second: slice) -> tuple[list, Tensor, Tensor, np.ndarray]:
    """An LSTM-like step: h @ R.T + b as gates, a sigmoid over them, read through two slices
    by two kernels (one each), as i, f, o are in a cell's update and its output."""
    rng = np.random.default_rng(0)
    hs, rs, bs = (rng.standard_normal(s).astype(np.float32) for s in ((2, 8), (32, 8), (32,)))
    gates = (Tensor(hs) @ Tensor(rs).transpose(0, 1) + Tensor(bs)).sigmoid()
    one, two = gates[:, first] * 2, gates[:, second].sum(-1)
    items = schedule.create_schedule([one.lazy, two.lazy])
    return items, one, two, 1 / (1 + np.exp(-(hs @ rs.T + bs)))


def test_slices_that_do_not_overlap_share_no_work():
    """Two kernels that read a value through slices that do not overlap compute each element
    once between them: the value needs no buffer of its own (an LSTM step ran its sigmoid of
    i, f, o as a kernel of its own, and its gates, and wrote both out)."""
    items, one, two, ref = _gate_kernels(slice(0, 16), slice(16, 32))
    assert len(items) == 3, items      # the matmul, then each reader with its sigmoid fused
    assert [_exponentials(it) for it in items] == [0, 1, 1], items
    np.testing.assert_allclose(one.numpy(), ref[:, :16] * 2, rtol=1e-5)
    np.testing.assert_allclose(two.numpy(), ref[:, 16:].sum(-1), rtol=1e-5)


def test_slices_that_overlap_still_store_the_shared_value():
    items, one, two, ref = _gate_kernels(slice(0, 20), slice(16, 32))
    assert len(items) == 4, items      # the sigmoid gets a buffer: both would compute 16:20
    np.testing.assert_allclose(one.numpy(), ref[:, :20] * 2, rtol=1e-5)
    np.testing.assert_allclose(two.numpy(), ref[:, 16:].sum(-1), rtol=1e-5)


def test_a_cat_that_several_kernels_read_is_stored():
    """A padded read counts as two toward MAX_SHARED_READS: cat([dq, dk, dv]) of three
    permuted head-major gradients, read by the qkv weight's and input's gradients and by the
    bias's column sum, is written once; the sum decoded every piece's index per element."""
    rng = np.random.default_rng(0)
    dq, dk, dv = (rng.standard_normal((2, 4, 8, 16)).astype(np.float32) for _ in range(3))
    xs, ws = rng.standard_normal((2, 8, 32)).astype(np.float32), \
        rng.standard_normal((192, 32)).astype(np.float32)
    heads = [Tensor(g).permute(0, 2, 1, 3).reshape(2, 8, 64) for g in (dq, dk, dv)]
    dqkv = portkit.cat(heads, -1)
    bias = dqkv.sum(axis=(0, 1))
    weight = dqkv.reshape(16, 192).transpose(0, 1) @ Tensor(xs).reshape(16, 32)
    grad_x = dqkv @ Tensor(ws)
    items = schedule.create_schedule([bias.lazy, weight.lazy, grad_x.lazy])
    assert [it.root.shape for it in items] == [(2, 8, 192), (192,), (192, 32), (2, 8, 32)]
    assert all(items[0].root in it.inputs for it in items[1:])
    assert len(items[1].inputs) == 1, items      # the column sum reads one plain buffer
    ref = np.concatenate([g.transpose(0, 2, 1, 3).reshape(2, 8, 64) for g in (dq, dk, dv)], -1)
    np.testing.assert_allclose(bias.numpy(), ref.sum((0, 1)), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(weight.numpy(), ref.reshape(16, 192).T @ xs.reshape(16, 32),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(grad_x.numpy(), ref @ ws, rtol=1e-4, atol=1e-4)


def test_an_optimizer_step_computes_the_loss_in_its_own_schedule(monkeypatch):
    """The loss that backward() ran from is computed with the step's updates: reading it
    afterwards is a copy, not a second schedule with kernels of its own to compile (an MLP's
    first training step compiled two more kernels after the step's, 0.13 s of its 1.2)."""
    from portkit import schedule as schedules
    model = nn.Linear(8, 4)
    opt = optim.SGD(model.parameters(), lr=0.1)
    x = Tensor(np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32))
    y = Tensor(np.array([0, 1, 2, 3, 0], np.int32))
    loss = model(x).cross_entropy(y)
    expected = float(loss.detach().numpy())
    loss = model(x).cross_entropy(y)
    loss.backward()
    realized = []
    original = schedules.realize
    monkeypatch.setattr(schedules, "realize",
                        lambda outs, *a, **k: (realized.append(outs), original(outs, *a, **k)))
    opt.step()
    assert loss.lazy.realized and len(realized) == 1
    assert loss.item() == pytest.approx(expected, rel=1e-6) and len(realized) == 1


def test_a_weight_read_at_every_step_gets_one_contraction_for_its_gradient():
    """sum_t dz_t.T @ h_t over a recurrence's steps is cat(dz).T @ cat(h), one matmul over
    all the steps: an LSTM's hidden weight's gradient was 34 products of depth 16, each
    writing a (1024, 256) buffer, and a sum reading all of them (10.4 ms of a 54 ms step)."""
    from portkit import graph
    from portkit.nn import functional
    rng = np.random.default_rng(0)
    ws = rng.standard_normal((6, 6)).astype(np.float32) / 3
    w = Tensor(ws, requires_grad=True)
    h = Tensor(rng.standard_normal((3, 6)).astype(np.float32))
    hs, total = [h.numpy()], None
    for _ in range(5):
        h = functional.linear(h, w).tanh()
        hs.append(h.detach().numpy())
        total = h.sum() if total is None else total + h.sum()
    total.backward()
    items = schedule.create_schedule([w.grad.lazy])
    products = [n for it in items for n in graph.toposort(
        [it.root], stop=lambda n, it=it: n is not it.root and n in it.inputs)
        if n.op is GraphOp.REDUCE and n.src[0].op is Op.MUL and n.shape == (1, 6, 6)]
    assert len(products) == 1, items      # the others are the steps' h gradients, (3, 1, 6)
    assert products[0].src[0].shape[0] == 5 * 3                   # every step's batch rows
    # backpropagation by hand: z_t = h_(t-1) @ w.T, h_t = tanh(z_t)
    grad, dh = np.zeros((6, 6)), np.zeros((3, 6))
    for t in range(5, 0, -1):
        dz = (dh + 1) * (1 - hs[t].astype(np.float64) ** 2)
        grad += dz.T @ hs[t - 1]
        dh = dz @ ws
    np.testing.assert_allclose(w.grad.numpy(), grad, rtol=1e-4, atol=1e-5)
