"""Optimizers save and restore their state: a resumed run matches an uninterrupted one."""
import numpy as np
import pytest

from portkit import nn, optim
from portkit.tensor import Tensor

pytestmark = pytest.mark.usefixtures("backend")


def _train(make_optimizer, resume_at: int | None) -> float:
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((8, 4)).astype(np.float32))
    y = Tensor(rng.standard_normal((8, 2)).astype(np.float32))
    start = {"weight": np.full((2, 4), 0.1, np.float32), "bias": np.zeros(2, np.float32)}
    model = nn.Linear(4, 2)
    model.load_state_dict(start)
    opt = make_optimizer(model.parameters())
    for step in range(6):
        if step == resume_at:
            saved = opt.state_dict()
            weights = {k: v.numpy() for k, v in model.state_dict().items()}
            model = nn.Linear(4, 2)
            model.load_state_dict(weights)
            opt = make_optimizer(model.parameters())
            opt.lr = 123.0                   # overwritten by the saved hyperparameters
            opt.load_state_dict(saved)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


@pytest.mark.parametrize("make_optimizer", [
    lambda p: optim.Adam(p, lr=0.1), lambda p: optim.AdamW(p, lr=0.1),
    lambda p: optim.SGD(p, lr=0.1, momentum=0.9)], ids=["Adam", "AdamW", "SGD"])
def test_resumed_run_matches_an_uninterrupted_one(make_optimizer):
    assert _train(make_optimizer, 3) == _train(make_optimizer, None)
