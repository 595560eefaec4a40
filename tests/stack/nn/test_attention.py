"""scaled_dot_product_attention (portkit/tensor/functional.py) against torch's: scale, masks,
non-square causal, grouped-query heads, dropout; forward and backward on every backend."""
import numpy as np
import pytest

import portkit.nn.functional as PF
from portkit.tensor import Tensor

torch = pytest.importorskip("torch")
F = torch.nn.functional
pytestmark = pytest.mark.usefixtures("backend")

RNG = np.random.default_rng(5)
BOOL_MASK = RNG.random((3, 5)) > 0.4
BOOL_MASK[1] = False                        # a row with no key left: torch gives 0 there
FLOAT_MASK = RNG.standard_normal((3, 5)).astype(np.float32)
FLOAT_MASK[2, 1:] = -np.inf


def _attention(**kwargs):
    """fn(q, k, v) for check: ours on Tensors, torch's on torch tensors, masks as constants."""
    def call(q, k, v):
        ours = isinstance(q, Tensor)
        options = dict(kwargs)
        mask = options.pop("attn_mask", None)
        if mask is not None:
            options["attn_mask"] = Tensor(mask) if ours else torch.tensor(mask)
        return (PF if ours else F).scaled_dot_product_attention(q, k, v, **options)
    return call


@pytest.mark.parametrize("kwargs,heads", [
    ({"scale": 0.3}, (2, 2)),
    ({"is_causal": True}, (2, 2)),                       # L=3 < S=5: top-left causal
    ({"attn_mask": BOOL_MASK}, (2, 2)),
    ({"attn_mask": FLOAT_MASK, "scale": 2.0}, (2, 2)),
    ({"enable_gqa": True}, (4, 2)),
    ({"enable_gqa": True, "attn_mask": FLOAT_MASK}, (6, 2)),
    ({"enable_gqa": True, "is_causal": True, "dropout_p": 0.0}, (6, 3)),
], ids=["scale", "causal", "bool-mask", "float-mask", "gqa", "gqa+mask",
         "gqa+causal"])
def test_attention_matches_torch_forward_and_backward(kwargs, heads, check, data):
    q, k, v = data(2, heads[0], 3, 8), data(2, heads[1], 5, 8), data(2, heads[1], 5, 4)
    check(_attention(**kwargs), q, k, v, atol=1e-4)


def test_causal_with_more_queries_than_keys(check, data):
    check(_attention(is_causal=True), data(6, 4), data(3, 4), data(3, 2), atol=1e-4)


def test_float_mask_gets_a_gradient(check, data):
    mask = data(3, 5)
    check(lambda q, k, v, m: (PF if isinstance(q, Tensor) else F).scaled_dot_product_attention(
        q, k, v, attn_mask=m), data(2, 3, 4), data(2, 5, 4), data(2, 5, 4), mask, atol=1e-4)


def test_grouped_heads_that_do_not_divide_raise_as_torch(data):
    q, k = data(1, 3, 2, 4), data(1, 2, 2, 4)
    with pytest.raises(RuntimeError, match="divide"):
        F.scaled_dot_product_attention(torch.tensor(q), torch.tensor(k), torch.tensor(k),
                                       enable_gqa=True)
    with pytest.raises(RuntimeError, match=r"key \(2\).*query \(3\)"):
        PF.scaled_dot_product_attention(Tensor(q), Tensor(k), Tensor(k), enable_gqa=True)


def test_bad_dropout_mask_dtype_and_mask_with_causal_are_refused_when_written(data):
    q = Tensor(data(2, 3, 4))
    mask = np.ones((3, 3), bool)
    with pytest.raises(RuntimeError, match="is_causal"):       # torch documents this error
        F.scaled_dot_product_attention(*[torch.tensor(data(2, 3, 4), requires_grad=True)] * 3,
                                       attn_mask=torch.tensor(mask), is_causal=True)
    with pytest.raises(RuntimeError, match="is_causal"):
        q.scaled_dot_product_attention(q, q, attn_mask=Tensor(mask), is_causal=True)
    with pytest.raises(RuntimeError, match="between 0 and 1"):
        q.scaled_dot_product_attention(q, q, dropout_p=1.5)
    with pytest.raises(TypeError, match="bool or float"):
        q.scaled_dot_product_attention(q, q, attn_mask=Tensor(np.ones((3, 3), np.int32)))


def test_dropout_zero_and_one_edges(check, data):
    q, k, v = data(2, 3, 4), data(2, 5, 4), data(2, 5, 4)
    check(_attention(dropout_p=0.0), q, k, v, atol=1e-4)
    check(_attention(dropout_p=1.0), q, k, v)            # all weights dropped: 0, gradients 0


def test_dropout_drops_weights_and_scales_the_kept_by_one_over_keep():
    p, length = 0.3, 64
    # q = k = 0: every weight is 1/S; v = I: the output is the dropped weight matrix itself
    q = Tensor(np.zeros((length, 4), np.float32), requires_grad=True)
    v = Tensor(np.eye(length, dtype=np.float32), requires_grad=True)
    out = q.scaled_dot_product_attention(q, v, dropout_p=p)
    weights = out.numpy()
    kept = weights != 0
    assert abs(kept.mean() - (1 - p)) < 0.03, kept.mean()
    np.testing.assert_allclose(weights[kept], 1 / (length * (1 - p)), rtol=1e-5)
    g = RNG.standard_normal((length, length)).astype(np.float32)
    (out * Tensor(g)).sum().backward()
    # the backward pass sees the forward's mask: d(W v)/dv = W^T g with the same W
    np.testing.assert_allclose(v.grad.numpy(), weights.T @ g, rtol=1e-4, atol=1e-5)
