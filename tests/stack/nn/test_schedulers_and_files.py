"""LR schedules against torch.optim.lr_scheduler, Module.to, and state dicts through .safetensors
files (issue 15)."""
import numpy as np
import pytest

import portkit as pk
from portkit import nn, optim
from portkit.optim import SGD, Adam, lr_scheduler

torch = pytest.importorskip("torch")

SCHEDULES = {
    "StepLR": ({"step_size": 3, "gamma": 0.5}),
    "MultiStepLR": ({"milestones": [2, 5, 6], "gamma": 0.3}),
    "ExponentialLR": ({"gamma": 0.9}),
    "CosineAnnealingLR": ({"T_max": 7, "eta_min": 0.01}),
    "LambdaLR": ({"lr_lambda": lambda epoch: 1 / (1 + epoch)}),
    "LinearLR": ({"start_factor": 0.25, "end_factor": 0.9, "total_iters": 4}),
}


def _ours_and_torchs(name):
    ours = SGD([pk.Tensor.zeros(2).requires_grad_()], lr=0.2)
    theirs = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.2)
    return (getattr(lr_scheduler, name)(ours, **SCHEDULES[name]),
            getattr(torch.optim.lr_scheduler, name)(theirs, **SCHEDULES[name]))


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_schedules_set_torchs_learning_rates(name):
    ours, theirs = _ours_and_torchs(name)
    for _ in range(16):
        np.testing.assert_allclose(ours.get_last_lr(), theirs.get_last_lr(), rtol=1e-12)
        assert ours.optimizer.lr == ours.get_last_lr()[0]
        ours.optimizer.step()
        theirs.optimizer.step()
        ours.step()
        theirs.step()


@pytest.mark.parametrize("name", ["StepLR", "CosineAnnealingLR"])
def test_a_schedule_resumes_from_its_state_dict(name):
    ours, _ = _ours_and_torchs(name)
    for _ in range(5):
        ours.step()
    state, optimizer_state = ours.state_dict(), ours.optimizer.state_dict()
    resumed, _ = _ours_and_torchs(name)
    resumed.optimizer.load_state_dict(optimizer_state)
    resumed.load_state_dict(state)
    for _ in range(4):
        ours.step()
        resumed.step()
        assert resumed.get_last_lr() == ours.get_last_lr()


@pytest.mark.parametrize("kwargs", [{}, {"mode": "max", "threshold_mode": "abs", "cooldown": 2},
                                    {"patience": 0, "min_lr": 0.05, "factor": 0.5}])
def test_reduce_on_plateau_follows_torch(kwargs):
    ours = lr_scheduler.ReduceLROnPlateau(SGD([pk.Tensor.zeros(2).requires_grad_()], lr=0.2),
                                          patience=kwargs.pop("patience", 2), **kwargs)
    theirs = torch.optim.lr_scheduler.ReduceLROnPlateau(
        torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.2), patience=ours.patience,
        **kwargs)
    for metric in [5, 4, 4, 4.0001, 4, 3, 3, 3, 3, 3, 3, 2.5, 2.5, 2.5, 2.5, 7, 7]:
        ours.step(metric)
        theirs.step(metric)
        assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), rel=1e-12)


@pytest.mark.parametrize("optimizer,kwargs", [
    ("SGD", {"three_phase": True}), ("Adam", {"anneal_strategy": "linear", "pct_start": 0.4}),
    ("SGD", {"cycle_momentum": False, "div_factor": 10.0})])
def test_one_cycle_follows_torch(optimizer, kwargs):
    settings = {"lr": 0.1, "momentum": 0.9} if optimizer == "SGD" else {"lr": 0.1}
    ours_opt = getattr(optim, optimizer)([pk.Tensor.zeros(2).requires_grad_()], **settings)
    theirs_opt = getattr(torch.optim, optimizer)([torch.zeros(2, requires_grad=True)],
                                                 **settings)
    ours = lr_scheduler.OneCycleLR(ours_opt, 0.5, total_steps=11, **kwargs)
    theirs = torch.optim.lr_scheduler.OneCycleLR(theirs_opt, 0.5, total_steps=11, **kwargs)
    for _ in range(11):
        assert ours.get_last_lr() == pytest.approx(theirs.get_last_lr(), rel=1e-12)
        group = theirs_opt.param_groups[0]
        momentum = ours_opt.momentum if optimizer == "SGD" else ours_opt.betas[0]
        assert momentum == pytest.approx(group.get("momentum", group.get("betas", [0])[0]))
        ours_opt.step()
        theirs_opt.step()
        ours.step()
        theirs.step()
    with pytest.raises(ValueError, match="past total_steps 11"):
        ours.step()


def test_bad_schedule_arguments_raise_at_the_call():
    optimizer = SGD([pk.Tensor.zeros(2).requires_grad_()], lr=0.1)
    with pytest.raises(ValueError, match="step_size must be an int >= 1"):
        lr_scheduler.StepLR(optimizer, 0)
    with pytest.raises(TypeError, match="portkit.optim optimizer"):
        lr_scheduler.StepLR(torch.optim.SGD([torch.zeros(1, requires_grad=True)]), 2)
    with pytest.raises(ValueError, match="T_max must be > 0"):
        lr_scheduler.CosineAnnealingLR(optimizer, 0)


def test_module_to_moves_and_casts_every_tensor_and_keeps_the_objects():
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    weight = model[0].weight
    optimizer = Adam(model.parameters(), lr=0.1)
    model(pk.Tensor.ones(2, 3)).sum().backward()
    before = weight.numpy()
    assert model.to("interpreter") is model
    assert model[0].weight is weight and weight.device == "interpreter"
    assert weight.grad.device == "interpreter" and weight.requires_grad
    np.testing.assert_array_equal(weight.numpy(), before)
    optimizer.step()                     # the optimizer updates the moved tensors
    assert not np.array_equal(weight.numpy(), before)
    model.to(pk.float64)
    assert weight.dtype == pk.float64 and weight.device == "interpreter"
    model.to("cpu", dtype="float32")
    assert weight.dtype == pk.float32 and weight.device == "cpu"


def test_state_dict_round_trips_through_a_safetensors_file(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm2d(4))
    state = model.state_dict()
    state["mask"] = pk.Tensor([True, False])
    state["half"] = pk.Tensor(np.arange(3), pk.bfloat16)
    nn.save_safetensors(state, tmp_path / "m.safetensors", metadata={"epoch": "3"})
    loaded = nn.load_safetensors(tmp_path / "m.safetensors")
    assert all(isinstance(t, pk.Tensor) for t in loaded.values())
    for name, tensor in state.items():
        assert loaded[name].dtype == tensor.dtype, name
        np.testing.assert_array_equal(loaded[name].numpy(), tensor.numpy())
    assert nn.safetensors_metadata(tmp_path / "m.safetensors") == {"epoch": "3"}
    # torch reads what portkit writes, bfloat16 included
    from safetensors.torch import load_file
    theirs = load_file(tmp_path / "m.safetensors")
    assert theirs["half"].dtype == torch.bfloat16 and theirs["half"].tolist() == [0, 1, 2]
    other = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm2d(4))
    other.load_state_dict({k: v for k, v in loaded.items() if k not in ("mask", "half")})
    np.testing.assert_array_equal(other[0].weight.numpy(), model[0].weight.numpy())


def test_a_corrupt_safetensors_file_raises_the_librarys_error(tmp_path):
    from safetensors import SafetensorError
    path = tmp_path / "bad.safetensors"
    path.write_bytes((10 ** 12).to_bytes(8, "little") + b"{}")
    with pytest.raises(SafetensorError, match="header too large"):
        nn.load_safetensors(path)
