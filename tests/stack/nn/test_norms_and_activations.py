"""Norms (layer_norm, rms_norm, group_norm, normalize), softmin, prelu, and the inverse hyperbolic
functions and running extremes of the Tensor, against PyTorch forward and backward (issue 15)."""
import numpy as np
import pytest

from portkit.nn import functional as F
from portkit.tensor import Tensor

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("backend")
TF = torch.nn.functional



def test_layer_norm_and_rms_norm_with_weights(check, data, same_call):
    x, w, b = data(2, 3, 4), data(3, 4), data(3, 4)
    check(same_call("layer_norm", (3, 4)), x)
    check(lambda x, w, b: (F if isinstance(x, Tensor) else TF).layer_norm(x, (4,), w[0], b[0]),
          x, w, b, atol=1e-4)
    check(same_call("rms_norm", (4,)), x)
    check(lambda x, w: (F if isinstance(x, Tensor) else TF).rms_norm(x, [3, 4], w, 1e-3), x, w)


def test_group_norm(check, data, same_call):
    x, w, b = data(2, 6, 3, 2), data(6), data(6)
    check(same_call("group_norm", 3), x, atol=1e-4)
    check(lambda x, w, b: (F if isinstance(x, Tensor) else TF).group_norm(x, 2, w, b, 1e-3),
          x, w, b, atol=1e-4)


@pytest.mark.parametrize("p,dim", [(2.0, 1), (1.0, -1), (3.0, 0), (float("inf"), 1)])
def test_normalize(p, dim, check, data, same_call):
    check(same_call("normalize", p, dim), data(3, 4))


def test_normalize_of_a_zero_vector_has_a_finite_gradient(check, same_call):
    check(same_call("normalize"), np.array([[0.0, 0.0], [3.0, 4.0]], np.float32))


def test_softmin_and_prelu(check, data, same_call):
    check(same_call("softmin", 1), data(3, 5))
    check(lambda x: F.softmin(x) if isinstance(x, Tensor) else TF.softmin(x, 1), data(3, 5))
    check(same_call("prelu"), data(2, 3, 4), data(3))
    check(same_call("prelu"), data(2, 3), np.array([0.25], np.float32))


@pytest.mark.parametrize("name,low,high", [("asinh", -30, 30), ("acosh", 1.01, 40),
                                            ("atanh", -0.99, 0.99), ("log1p", -0.9, 20)])
def test_inverse_hyperbolics_and_log1p(name, low, high, check):
    x = np.random.default_rng(3).uniform(low, high, (4, 5)).astype(np.float32)
    check(lambda t: getattr(t, name)(), x)
    edges = {"asinh": [0.0, 1e-10, -1e30, np.inf], "acosh": [1.0, 1 + 1e-6, 0.5, 3e38],
             "atanh": [0.0, 1e-10, 1.0, -1.5], "log1p": [1e-10, -1.0, -2.0, 1e30]}[name]
    edges = np.array(edges, np.float32)
    got, want = getattr(Tensor(edges), name)().numpy(), getattr(torch, name)(torch.tensor(edges))
    np.testing.assert_allclose(got, want.numpy(), rtol=2e-7)


@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_cummax_and_cummin_give_values_indices_and_gradients_as_torch(name, check):
    x = np.array([[1, 3, 3, 2, 5, np.nan, 7, np.nan, 1], [4, 4, 2, 2, 9, 0, 0, -1, 9]],
                 np.float32)
    ours, theirs = getattr(Tensor(x), name)(1), getattr(torch.tensor(x), name)(1)
    np.testing.assert_array_equal(ours.values.numpy(), theirs.values.numpy())
    np.testing.assert_array_equal(ours.indices.numpy(), theirs.indices.numpy())
    check(lambda t: getattr(t, name)(0)[0], np.nan_to_num(x))
    ints = np.array([3, 1, 3, -2], np.int32)
    assert getattr(Tensor(ints), name)(0).indices.tolist() == getattr(
        torch.tensor(ints), name)(0).indices.tolist()


def test_bad_arguments_raise_at_the_call():
    x = Tensor.ones(2, 6, 3)
    with pytest.raises(RuntimeError, match="divisible by num_groups=4"):
        F.group_norm(x, 4)
    with pytest.raises(RuntimeError, match=r"normalized_shape \[4\] does not match"):
        F.rms_norm(x, (4,))
    with pytest.raises(RuntimeError, match=r"normalized_shape \[2, 3\] does not match"):
        F.layer_norm(x, (2, 3))
    with pytest.raises(RuntimeError, match="1 or one per channel"):
        F.prelu(x, Tensor.ones(4))
    with pytest.raises(ValueError, match="p must be > 0"):
        F.normalize(x, 0)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_with_torchs_signature_updates_the_running_statistics(training, check, data):
    x, w, b = data(4, 3, 5), data(3), data(3)
    stats = {}
    for lib, tensor in (("ours", Tensor), ("theirs", torch.tensor)):
        stats[lib] = (tensor(np.zeros(3, np.float32)), tensor(np.ones(3, np.float32)))

    def call(x, w, b):
        ours = isinstance(x, Tensor)
        mean, var = stats["ours" if ours else "theirs"]
        return (F if ours else TF).batch_norm(x, mean, var, w, b, training, 0.2, 1e-3)
    check(call, x, w, b, atol=1e-4)
    for got, want in zip(stats["ours"], stats["theirs"]):
        # absolute too: a running mean near 0 (4e-6 in one run) differs from torch's in its
        # last bits, as the two sum the batch in different orders
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


def test_one_hot_infers_the_class_count_and_embedding_skips_the_padding_row(check, data):
    index = np.array([[1, 4], [0, 1]], np.int32)
    np.testing.assert_array_equal(F.one_hot(Tensor(index)).numpy(),
                                  TF.one_hot(torch.tensor(index, dtype=torch.long)).numpy())
    check(lambda w: F.embedding(Tensor(index), w, padding_idx=1) if isinstance(w, Tensor)
          else TF.embedding(torch.tensor(index, dtype=torch.long), w, padding_idx=1),
          data(5, 3))


@pytest.mark.parametrize("name,shape", [("BatchNorm1d", (4, 3)), ("BatchNorm1d", (4, 3, 2)),
                                        ("BatchNorm3d", (2, 3, 2, 2, 2))])
def test_batchnorm_modules_match_torchs_in_train_and_eval(name, shape, data):
    from portkit import nn
    x = data(*shape)
    ours, theirs = getattr(nn, name)(3), getattr(torch.nn, name)(3)
    for _ in range(2):
        np.testing.assert_allclose(ours(Tensor(x)).numpy(), theirs(torch.tensor(x)).detach(),
                                   atol=1e-5)
    ours.eval(), theirs.eval()
    np.testing.assert_allclose(ours(Tensor(x)).numpy(), theirs(torch.tensor(x)).detach(),
                               atol=1e-5)
    with pytest.raises(ValueError, match=f"{name} expects"):
        ours(Tensor(x).reshape(-1))
