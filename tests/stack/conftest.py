"""Fixtures of the stack tests: `backend` runs a test once per backend that loads here; `data` and
`check` compare Tensor ops with PyTorch (CPU)."""
import numpy as np
import pytest

from portkit import backends, runtime
from portkit.tensor import Tensor

BACKENDS = [name for name, reason in backends.available().items() if reason is None]

RNG = np.random.default_rng(0)


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch) -> str:
    """Every tensor the test makes without `device=` lives on this backend."""
    monkeypatch.setenv("PORTKIT_DEVICE", request.param)
    return request.param


@pytest.fixture
def capabilities(backend):
    """The capabilities of the backend under test (its dtypes, ops, limits)."""
    return runtime.get(backend).capabilities


@pytest.fixture
def data():
    """data(*shape, positive=False): float32 normal samples (|x| + 0.5 if positive)."""
    def sample(*shape, positive=False):
        x = RNG.standard_normal(shape).astype(np.float32)
        return np.abs(x) + 0.5 if positive else x
    return sample


@pytest.fixture
def same_call():
    """same_call(name, *args, **kwargs): fn(*tensors) calling `name` from portkit's
    nn.functional or torch's, whichever the tensors belong to, with the same extra arguments."""
    from portkit.nn import functional
    torch_functional = pytest.importorskip("torch").nn.functional

    def make(name, *args, **kwargs):
        def call(*tensors):
            module = functional if isinstance(tensors[0], Tensor) else torch_functional
            return getattr(module, name)(*tensors, *args, **kwargs)
        return call
    return make


@pytest.fixture
def check():
    """check(fn, *arrays, torch_fn=None, ...): fn on portkit tensors and torch_fn (default fn)
    on torch tensors agree, and so do the gradients of their inputs."""
    torch = pytest.importorskip("torch")

    def compare(fn, *arrays, torch_fn=None, atol=1e-5, rtol=1e-4, grad=True):
        ours = [Tensor(a, requires_grad=grad) for a in arrays]
        theirs = [torch.tensor(a, requires_grad=grad) for a in arrays]
        out, ref = fn(*ours), (torch_fn or fn)(*theirs)
        np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), atol=atol, rtol=rtol)
        if grad:
            weights = RNG.standard_normal(ref.shape).astype(np.float32)
            if out.requires_grad:     # ops with zero gradient everywhere (sign) record nothing
                (out * Tensor(weights)).sum().backward()
            if ref.requires_grad:
                (ref * torch.tensor(weights)).sum().backward()
            for o, t in zip(ours, theirs):
                expected = t.grad.numpy() if t.grad is not None else np.zeros_like(o.numpy())
                got = o.grad.numpy() if o.grad is not None else np.zeros_like(expected)
                np.testing.assert_allclose(got, expected, atol=atol * 10, rtol=rtol * 10)
    return compare
