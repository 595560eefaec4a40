"""The `backend` fixture: a test that uses it runs once per backend that loads here."""
import pytest

from portkit import backends, runtime

BACKENDS = [name for name, reason in backends.available().items() if reason is None]


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch) -> str:
    """Every tensor the test makes without `device=` lives on this backend."""
    monkeypatch.setenv("PORTKIT_DEVICE", request.param)
    return request.param


@pytest.fixture
def capabilities(backend):
    """The capabilities of the backend under test (its dtypes, ops, limits)."""
    return runtime.get(backend).capabilities
