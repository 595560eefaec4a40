"""Data parallelism: two replicas on two devices train as one model on the whole batch."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import portkit
from portkit import Tensor, distributed, nn, optim
from portkit.schedule import runner

RNG = np.random.default_rng(0)
X = RNG.standard_normal((8, 6)).astype(np.float32)
Y = RNG.standard_normal((8, 3)).astype(np.float32)
LR, MOMENTUM = 0.1, 0.9


def mse(output: Tensor, target: Tensor) -> Tensor:
    return ((output - target) ** 2).mean()


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def losses_on_one_device(model, steps, device="cpu"):
    opt = optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    found = []
    for _ in range(steps):
        opt.zero_grad()
        loss = mse(model(Tensor(X, device=device)), Tensor(Y, device=device))
        loss.backward()
        opt.step()
        found.append(loss.item())
    return found


def losses_in_parallel(model, devices, steps):
    parallel = distributed.DataParallel(model, devices,
                                        lambda p: optim.SGD(p, lr=LR, momentum=MOMENTUM))
    found = []
    for _ in range(steps):
        parallel.zero_grad()
        losses = [mse(replica(xs), ys) for replica, xs, ys in zip(
            parallel.replicas, parallel.scatter(Tensor(X)), parallel.scatter(Tensor(Y)))]
        loss = parallel.backward(losses)
        parallel.step()
        assert loss.device == parallel.devices[0]
        found.append(loss.item())
    return found, parallel


def test_two_replicas_follow_the_loss_curve_of_one_device_on_the_whole_batch():
    single = mlp()
    state = {name: t.numpy() for name, t in single.state_dict().items()}
    expected = losses_on_one_device(single, 4)
    twin = mlp()
    twin.load_state_dict(state)
    found, parallel = losses_in_parallel(twin, ["cpu", "cpu:1"], 4)
    np.testing.assert_allclose(found, expected, rtol=1e-5)
    assert expected[-1] < expected[0]
    first, second = (r.state_dict() for r in parallel.replicas)
    assert {t.device for t in second.values()} == {"cpu:1"}
    for name, weight in single.state_dict().items():
        np.testing.assert_array_equal(first[name].numpy(), second[name].numpy())
        np.testing.assert_allclose(first[name].numpy(), weight.numpy(), rtol=1e-5, atol=1e-6)


def test_all_reduce_sums_or_averages_onto_every_device():
    a, b = Tensor([1.0, 2.0]), Tensor([10.0, 20.0], device="cpu:1")
    total = distributed.all_reduce([a, b])
    assert [t.device for t in total] == ["cpu", "cpu:1"]
    assert [t.tolist() for t in total] == [[11.0, 22.0]] * 2
    assert distributed.all_reduce([a, b], "mean")[1].tolist() == [5.5, 11.0]
    with pytest.raises(ValueError, match="shapes differ"):
        distributed.all_reduce([a, Tensor([1.0], device="cpu:1")])


def test_batchnorm_running_statistics_are_averaged_across_the_replicas():
    """Each replica's BatchNorm updates its statistics from its own share; backward sets them
    to their mean, so the replicas stay equal, and the running mean is the whole batch's."""
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 3))
    weight, bias = (t.numpy() for t in (model.items[0].weight, model.items[0].bias))
    single = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 3))
    single.load_state_dict({n: t.numpy() for n, t in model.state_dict().items()})
    mse(single(Tensor(X)), Tensor(Y)).backward()
    _, parallel = losses_in_parallel(model, ["cpu", "cpu:1"], 1)
    first, second = (r.items[1] for r in parallel.replicas)
    for name in ("running_mean", "running_var"):
        np.testing.assert_array_equal(getattr(first, name).numpy(),
                                      getattr(second, name).numpy(), err_msg=name)
    np.testing.assert_allclose(first.running_mean.numpy(), single.items[1].running_mean.numpy(),
                               rtol=1e-5, atol=1e-6)
    shares = np.split(X @ weight.T + bias, 2)
    variance = np.mean([share.var(0, ddof=1) for share in shares], 0)
    np.testing.assert_allclose(first.running_var.numpy(), 0.9 + 0.1 * variance, rtol=1e-5)
    for replica in parallel.replicas:
        replica.eval()
    outputs = [r(Tensor(X, device=d)).numpy()
               for r, d in zip(parallel.replicas, parallel.devices)]
    np.testing.assert_array_equal(outputs[0], outputs[1])


def test_a_buffer_that_is_not_float_takes_the_first_replica_s_value():
    class Counting(nn.Module):
        def __init__(self):
            self.layer = nn.Linear(6, 3)
            self.seen = Tensor(np.array([3], np.int32))

    model = Counting()
    parallel = distributed.DataParallel(model, ["cpu", "cpu:1"])
    parallel.replicas[1].seen.assign(Tensor(np.array([5], np.int32), device="cpu:1"))
    parallel.all_reduce_buffers()
    assert parallel.replicas[1].seen.device == "cpu:1"
    assert [r.seen.tolist() for r in parallel.replicas] == [[3], [3]]


def test_a_data_parallel_step_is_scheduled_once_then_replayed(monkeypatch):
    """The step's graph holds copies between the devices; a realize of it again replays the
    launches and copies the first realize ran, as a one-device step does."""
    scheduled = []

    def counting(outs):
        scheduled.append(len(outs))
        return schedule(outs)
    schedule = runner.schedule
    monkeypatch.setattr(runner, "schedule", counting)
    single = mlp()
    state = {name: t.numpy() for name, t in single.state_dict().items()}
    expected = losses_on_one_device(single, 5)
    twin = mlp()
    twin.load_state_dict(state)
    counts = []
    parallel = distributed.DataParallel(twin, ["cpu", "cpu:1"],
                                        lambda p: optim.SGD(p, lr=LR, momentum=MOMENTUM))
    found = []
    for _ in range(5):
        scheduled.clear()
        parallel.zero_grad()
        losses = [mse(replica(xs), ys) for replica, xs, ys in zip(
            parallel.replicas, parallel.scatter(Tensor(X)), parallel.scatter(Tensor(Y)))]
        found.append(parallel.backward(losses).item())
        parallel.step()
        counts.append(len(scheduled))
    np.testing.assert_allclose(found, expected, rtol=1e-5)
    assert counts[2:] == [0, 0, 0], counts


def test_a_jitted_data_parallel_step_replays_the_eager_one(monkeypatch):
    """portkit.jit captures the whole step, its copies between the devices included; the
    replays schedule nothing and give the eager step's losses and weights bit for bit."""
    state = {name: t.numpy() for name, t in mlp().state_dict().items()}
    rng = np.random.default_rng(5)
    batches = [(rng.standard_normal((8, 6)).astype(np.float32),
                rng.standard_normal((8, 3)).astype(np.float32)) for _ in range(6)]
    results = []
    for jitted in (False, True):
        model = mlp()
        model.load_state_dict(state)
        parallel = distributed.DataParallel(model, ["cpu", "cpu:1"],
                                            lambda p: optim.SGD(p, lr=LR, momentum=MOMENTUM))

        def step(x, y, parallel=parallel):
            parallel.zero_grad()
            losses = [mse(replica(xs), ys) for replica, xs, ys in zip(
                parallel.replicas, parallel.scatter(x), parallel.scatter(y))]
            loss = parallel.backward(losses)
            parallel.step()
            return loss
        run = portkit.jit(step) if jitted else step
        losses = []
        for k, (x, y) in enumerate(batches):
            if jitted and k == 3:
                monkeypatch.setattr(runner, "schedule", _refuse)
            losses.append(run(Tensor(x), Tensor(y)).numpy())
        results.append((losses, [[t.numpy() for t in r.state_dict().values()]
                                 for r in parallel.replicas]))
    (eager, eager_weights), (replayed, replayed_weights) = results
    np.testing.assert_array_equal(replayed, eager)
    for a, b in zip(eager_weights, replayed_weights):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert run.plan is not None


def _refuse(outs):
    raise AssertionError("a replay scheduled a graph")


def test_a_batch_that_does_not_split_evenly_is_refused():
    parallel = distributed.DataParallel(mlp(), ["cpu", "cpu:1"])
    with pytest.raises(ValueError, match="multiple of 2"):
        parallel.scatter(Tensor(X[:3]))


@pytest.mark.slow
def test_two_opencl_devices_train_as_one():
    """On PoCL's two devices (POCL_DEVICES="pthread pthread"), copies through the host, 50
    SGD steps with momentum: 8 s with compiled kernels on disk (2 cores, load 7)."""
    script = (
        "import numpy as np, sys\n"
        "sys.path.insert(0, 'tests/stack')\n"
        "from test_distributed import mlp, losses_on_one_device, losses_in_parallel\n"
        "single = mlp().to('opencl')\n"
        "state = {n: t.numpy() for n, t in single.state_dict().items()}\n"
        "expected = losses_on_one_device(single, 50, 'opencl')\n"
        "twin = mlp()\n"
        "twin.load_state_dict(state)\n"
        "found, _ = losses_in_parallel(twin, ['opencl', 'opencl:1'], 50)\n"
        "np.testing.assert_allclose(found, expected, rtol=1e-5)\n"
        "assert expected[-1] < expected[0] / 2, expected\n"
        "print('same', found)\n")
    env = {**os.environ, "POCL_DEVICES": "pthread pthread"}
    done = subprocess.run([sys.executable, "-c", script], check=False, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("same")


@pytest.mark.slow
def test_two_processes_train_as_one_on_the_whole_batch(tmp_path):
    """torchrun starts two ranks (gloo on localhost); each trains on half the batch with its
    gradients averaged through the process group, and both end where one process ends on the
    whole batch. Slow for its three imports of torch: 26 s on 2 busy cores (load 3)."""
    pytest.importorskip("torch", reason="collectives across processes run through torch")
    steps = 50
    single = mlp()
    np.savez(tmp_path / "state.npz", **{n: t.numpy() for n, t in single.state_dict().items()})
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parents[1]), str(here)])}
    ranks = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(here / "distributed_worker.py"), str(tmp_path / "state.npz"), str(tmp_path),
         str(steps)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    expected = losses_on_one_device(single, steps)
    output = ranks.communicate(timeout=120)[0]
    assert ranks.returncode == 0, output
    first, second = (np.load(tmp_path / f"rank{r}.npz") for r in (0, 1))
    assert expected[-1] < expected[0] / 2
    np.testing.assert_allclose((first["losses"] + second["losses"]) / 2, expected, rtol=1e-5)
    for name, weight in single.state_dict().items():
        np.testing.assert_array_equal(first[name], second[name], err_msg=name)
        np.testing.assert_allclose(first[name], weight.numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=name)


def test_collectives_without_torch_name_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    with pytest.raises(distributed.ProcessGroupUnavailable, match="pip install torch"):
        distributed.ProcessGroupReducer(mlp()).broadcast_parameters()


def test_collectives_without_a_process_group_name_the_fix():
    pytest.importorskip("torch", reason="the check asks torch.distributed")
    with pytest.raises(distributed.ProcessGroupUnavailable, match="init_process_group"):
        distributed.process_group.all_reduce([Tensor([1.0])])
