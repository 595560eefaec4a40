"""nn functions (portkit/tensor/functional.py) through their Tensor methods: activations,
convolution, pools, losses, norms, attention, embedding."""
import numpy as np
import pytest

from portkit.tensor import Tensor

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("backend")


def test_activations_with_torch_names(check, data):
    F = torch.nn.functional
    check(lambda x: x.leaky_relu(0.1), data(4, 4), torch_fn=lambda x: F.leaky_relu(x, 0.1))
    check(lambda x: x.gelu(), data(4, 4), torch_fn=F.gelu)
    check(lambda x: x.gelu(approximate="tanh"), data(4, 4),
          torch_fn=lambda x: F.gelu(x, approximate="tanh"))
    check(lambda x: x.softplus(), data(4, 4), torch_fn=F.softplus)
    check(lambda x: x.clip(-0.5, 0.5), data(4, 4), torch_fn=lambda x: x.clamp(-0.5, 0.5))


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 1),
                                                            (1, 1, 2, 2)])
def test_conv2d(stride, padding, dilation, groups, check, data):
    x, w, b = data(2, 4, 7, 6), data(6, 4 // groups, 3, 3), data(6)
    check(lambda x, w, b: x.conv2d(w, b, stride, padding, dilation, groups)
          if isinstance(x, Tensor)
          else torch.nn.functional.conv2d(x, w, b, stride, padding, dilation, groups),
          x, w, b, atol=1e-4)


def test_pools(check, data):
    x = data(2, 3, 6, 5)
    F = torch.nn.functional
    check(lambda t: t.max_pool2d(2) if isinstance(t, Tensor) else F.max_pool2d(t, 2), x)
    check(lambda t: t.max_pool2d(3, 2, 1) if isinstance(t, Tensor)
          else F.max_pool2d(t, 3, 2, 1), x)
    check(lambda t: t.avg_pool2d(2) if isinstance(t, Tensor) else F.avg_pool2d(t, 2), x)


def test_losses_norms(check, data):
    F = torch.nn.functional
    x = data(4, 5)
    target = np.array([1, 0, 4, 2], np.int32)
    check(lambda t: t.cross_entropy(Tensor(target)) if isinstance(t, Tensor)
          else F.cross_entropy(t, torch.tensor(target, dtype=torch.long)), x)
    check(lambda t: t.layernorm(-1) if isinstance(t, Tensor) else F.layer_norm(t, (5,)), x)


def test_attention_causal(check, data):
    q, k, v = data(2, 4, 8), data(2, 4, 8), data(2, 4, 8)
    F = torch.nn.functional
    check(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True)
          if isinstance(q, Tensor) else F.scaled_dot_product_attention(q, k, v, is_causal=True),
          q, k, v, atol=1e-4)


def test_embedding_and_one_hot(check, data):
    w = data(10, 3)
    idx = np.array([[1, 9], [0, 1]], np.int32)
    check(lambda t: Tensor(idx).embedding(t) if isinstance(t, Tensor)
          else torch.nn.functional.embedding(torch.tensor(idx, dtype=torch.long), t), w)
    np.testing.assert_array_equal(Tensor(idx).one_hot(10).numpy(), np.eye(10)[idx])


def test_dropout_keeps_the_expected_share_scales_it_and_routes_gradients_through_it():
    x = Tensor(np.ones((200, 100), np.float32), requires_grad=True)
    out = x.dropout(0.25, training=True)
    kept = out.numpy() != 0
    assert abs(kept.mean() - 0.75) < 0.02, kept.mean()
    np.testing.assert_allclose(out.numpy()[kept], 1 / 0.75, rtol=1e-6)
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.where(kept, 1 / 0.75, 0), rtol=1e-6)
    assert x.dropout(0.25, training=False) is x
