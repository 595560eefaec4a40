"""portkit.jit: a replay gives exactly what the eager function gives, and what it cannot replay
it refuses with JitError."""
import itertools
import math

import numpy as np
import pytest

import portkit
from portkit import nn, optim, schedule, settings
from portkit.jit import JitError
from portkit.tensor import Tensor

RNG = np.random.default_rng(13)


def _no_scheduling(monkeypatch):
    """From now on, realizing anything but realized tensors (a .numpy()) fails."""
    realize = schedule.realize

    def only_realized(outs):
        assert all(lazy.realized for lazy in outs), "a replay built and scheduled a graph"
        realize(outs)
    monkeypatch.setattr(schedule, "realize", only_realized)


def _model(seed: int):
    rng = np.random.default_rng(seed)
    layers = [nn.Linear(12, 16), nn.Linear(16, 4)]
    for layer in layers:
        for p in layer.parameters():
            p.assign(Tensor(rng.standard_normal(p.shape).astype(np.float32) * 0.3)).realize()
    return layers


def _training(opt_kind: str):
    layers = _model(1)
    params = [p for layer in layers for p in layer.parameters()]
    opt = (optim.SGD(params, lr=0.05, momentum=0.9) if opt_kind == "sgd"
           else optim.Adam(params, lr=0.01))

    def step(x, y):
        opt.zero_grad()
        loss = layers[1](layers[0](x).relu()).cross_entropy(y)
        loss.backward()
        opt.step()
        return loss
    return step, params, opt


def _batches(steps: int):
    return [(RNG.standard_normal((8, 12)).astype(np.float32),
             RNG.integers(0, 4, 8).astype(np.int32)) for _ in range(steps)]


@pytest.mark.parametrize("opt_kind", ["sgd", "adam"])
def test_a_training_step_replays_bit_identically(backend, opt_kind, monkeypatch):
    batches = _batches(7)
    eager, eager_params, _ = _training(opt_kind)
    expected = [(eager(Tensor(x), Tensor(y)).numpy(), [p.numpy() for p in eager_params])
                for x, y in batches]
    jitted, jit_params, _ = _training(opt_kind)
    jitted = portkit.jit(jitted)
    for k, ((x, y), (loss, params)) in enumerate(zip(batches, expected)):
        x, y = Tensor(x).realize(), Tensor(y).realize()
        if k == 4:
            assert jitted.plan is not None      # replaying from here on
            _no_scheduling(monkeypatch)
        np.testing.assert_array_equal(jitted(x, y).numpy(), loss)
        for p, q in zip(jit_params, params):
            np.testing.assert_array_equal(p.numpy(), q)


def test_a_three_op_function_replays_with_new_data(backend, monkeypatch):
    def f(a, b, c):
        return (a * b + c).relu()
    calls = [[Tensor(RNG.standard_normal(16).astype(np.float32)).realize() for _ in range(3)]
             for _ in range(5)]
    expected = [f(*inputs).numpy() for inputs in calls]
    jitted = portkit.jit(f)
    for k, inputs in enumerate(calls):
        if k == 3:
            _no_scheduling(monkeypatch)
        np.testing.assert_array_equal(jitted(*inputs).numpy(), expected[k])
    assert jitted.plan is not None


def test_a_float_argument_is_read_again_at_every_call(backend, monkeypatch):
    x_np = RNG.standard_normal(16).astype(np.float32)
    x = Tensor(x_np)

    def f(x, scale):
        return x * scale + (1 - scale) * 2     # arithmetic on the number is replayed too
    scales = [0.5, 2.0, -1.25, 3.0, 0.1, 7.0]
    expected = [f(Tensor(x_np), scale).numpy() for scale in scales]
    jitted = portkit.jit(f)
    for k, scale in enumerate(scales):
        if k == 3:
            _no_scheduling(monkeypatch)
        np.testing.assert_array_equal(jitted(x, scale).numpy(), expected[k])


def test_a_learning_rate_set_outside_takes_effect():
    batches = _batches(6)
    eager, eager_params, eager_opt = _training("adam")
    jitted, jit_params, jit_opt = _training("adam")
    jitted = portkit.jit(jitted)
    for k, (x, y) in enumerate(batches):
        lr = 0.01 * 0.5 * (1 + math.cos(math.pi * k / 6))
        eager_opt.lr = jit_opt.lr = lr
        eager(Tensor(x), Tensor(y))
        jitted(Tensor(x), Tensor(y))
        for p, q in zip(jit_params, eager_params):
            np.testing.assert_array_equal(p.numpy(), q.numpy())
    assert jit_opt.t == eager_opt.t == 6 and type(jit_opt.t) is int
    assert jit_opt.lr == lr and type(jit_opt.lr) is float


def _replaying(fn, *args):
    jitted = portkit.jit(fn)
    for _ in range(3):
        jitted(*args)
    assert jitted.plan is not None
    return jitted


def test_another_shape_dtype_or_value_is_refused():
    x = Tensor(np.ones(4, np.float32))
    jitted = _replaying(lambda x, n: x * n, x, 2)
    with pytest.raises(JitError, match=r"argument 0 is a float32 tensor of shape \(5,\)"):
        jitted(Tensor(np.ones(5, np.float32)), 2)
    with pytest.raises(JitError, match="argument 0 is a int32 tensor"):
        jitted(Tensor(np.ones(4, np.int32)), 2)
    with pytest.raises(JitError, match="argument 1 is 3 instead of 2"):
        jitted(x, 3)
    with pytest.raises(JitError, match="takes Tensors, floats"):
        jitted(x, [2])


def test_another_device_is_refused(backend):
    other = "cpu" if backend == "interpreter" else "interpreter"
    jitted = _replaying(lambda x: x + 1, Tensor(np.ones(4, np.float32)))
    with pytest.raises(JitError, match=f"on {other} instead of"):
        jitted(Tensor(np.ones(4, np.float32), device=other))


@pytest.mark.parametrize("read", [lambda t: t.numpy(), lambda t: t.sum().item(),
                                  lambda t: t.tolist()])
def test_reading_values_inside_is_refused(read):
    def f(x):
        read(x + 1)
        return x * 2
    with pytest.raises(JitError, match=r"back to the host \(.numpy\(\), .item\(\)"):
        portkit.jit(f)(Tensor(np.ones(4, np.float32)))


def test_a_graph_that_depends_on_the_data_is_refused():
    def f(x, flip):
        return (x + 1) if flip else (x * 2).exp()     # a different kernel every call
    values = iter([True, False, True, False])
    jitted = portkit.jit(lambda x: f(x, next(values)))
    x = Tensor(np.ones(4, np.float32))
    jitted(x)
    jitted(x)
    with pytest.raises(JitError, match="did not launch the same work"):
        jitted(x)


def test_calls_that_launch_more_kernels_are_refused_naming_where_they_part():
    # a loop count kept in Python: one more kernel each call. The message names the first
    # launch that differs (the two calls' first kernels were the same, and all it showed)
    counts = iter(range(1, 10))

    def f(x):
        for _ in range(next(counts)):
            x = (x * 2).realize()
        return x.exp()
    jitted = portkit.jit(f)
    x = Tensor(np.ones(4, np.float32))
    jitted(x)
    jitted(x)
    with pytest.raises(JitError, match=r"3 kernels, then 4, parting at launch 3 \(after "
                                       r"e_4, e_4\): nothing / e_4"):
        jitted(x)


def test_a_number_kept_in_python_is_refused():
    count = [0]

    def f(x):
        count[0] += 1
        return x * float(count[0])     # a counter the function keeps in Python
    jitted = portkit.jit(f)
    x = Tensor(np.ones(4, np.float32))
    jitted(x)
    jitted(x)
    with pytest.raises(JitError, match="must be a float argument"):
        jitted(x)


def test_a_result_that_is_not_a_tensor_is_refused():
    with pytest.raises(JitError, match="returns a float"):
        portkit.jit(lambda x: 1.5)(Tensor(np.ones(4, np.float32)))


def test_a_closure_tensor_is_read_as_captured_and_uploads_are_compared():
    w = Tensor(np.full(4, 3.0, np.float32))
    jitted = _replaying(lambda x: x * w + Tensor(np.arange(4, dtype=np.float32)),
                        Tensor(np.ones(4, np.float32)))
    np.testing.assert_array_equal(jitted(Tensor(np.full(4, 2.0, np.float32))).numpy(),
                                  [6, 7, 8, 9])


def test_results_of_earlier_replays_keep_their_values():
    x = Tensor(np.arange(4, dtype=np.float32))
    jitted = portkit.jit(lambda x, s: (x * s).exp() + 1)
    results = [jitted(x, float(k)) for k in range(6)]
    for k, result in enumerate(results):
        np.testing.assert_allclose(result.numpy(), np.exp(np.arange(4) * k) + 1, rtol=1e-5)


def test_a_replay_under_portkit_check_runs_the_checked_launches(monkeypatch):
    x = Tensor(np.arange(4, dtype=np.float32))
    jitted = _replaying(lambda x, s: x * s, x, 1.0)
    monkeypatch.setenv("PORTKIT_CHECK", "1")
    np.testing.assert_array_equal(jitted(x, 3.0).numpy(), np.arange(4) * 3)


def test_more_argument_numbers_than_a_kernel_passes_are_refused():
    def f(x, *scales):
        out = x
        for s in scales:
            out = out * s
        return out
    with pytest.raises(JitError, match="distinct numbers from arguments"):
        portkit.jit(f)(Tensor(np.ones(4, np.float32)),
                       *(1.0 + k / 64 for k in range(schedule.MAX_SCALARS + 1)))


def test_an_argument_updated_in_place_is_the_one_passed_at_the_replay():
    def accumulate(total, x):
        total.assign(total + x)
    jitted = portkit.jit(accumulate)
    totals = [Tensor(np.zeros(4, np.float32)).realize() for _ in range(2)]
    for k in range(5):
        jitted(totals[k % 2], Tensor(np.full(4, float(k), np.float32)))
    np.testing.assert_array_equal(totals[0].numpy(), np.full(4, 0 + 2 + 4, np.float32))
    np.testing.assert_array_equal(totals[1].numpy(), np.full(4, 1 + 3, np.float32))


def test_batch_norm_running_statistics_are_updated_by_a_replay():
    def build():
        norm = nn.BatchNorm1d(6)
        norm.train()
        return norm
    eager, jitted_norm = build(), build()
    jitted = portkit.jit(lambda x: jitted_norm(x))
    for _ in range(5):
        x = RNG.standard_normal((8, 6)).astype(np.float32)
        np.testing.assert_array_equal(jitted(Tensor(x)).numpy(), eager(Tensor(x)).numpy())
        np.testing.assert_array_equal(jitted_norm.running_mean.numpy(),
                                      eager.running_mean.numpy())
        np.testing.assert_array_equal(jitted_norm.running_var.numpy(), eager.running_var.numpy())


def test_a_float_that_chose_the_ops_is_refused_when_it_would_choose_others():
    x = Tensor(np.full(4, 4.0, np.float32))
    jitted = _replaying(lambda x, s: x ** s, x, 2.5)     # not 0.5, which pow takes as sqrt
    np.testing.assert_allclose(jitted(x, 1.5).numpy(), np.full(4, 8.0), rtol=1e-6)
    with pytest.raises(JitError, match="compares otherwise"):
        jitted(x, 0.5)


def test_an_integral_float_exponent_is_captured_and_its_count_of_products_guarded():
    # pow took int() of an exponent of 2.0 to count its products, which a capture refuses
    x = Tensor(np.full(4, 4.0, np.float32))
    jitted = _replaying(lambda x, s: x ** s, x, 2.0)
    np.testing.assert_array_equal(jitted(x, 2.0).numpy(), np.full(4, 16.0))
    with pytest.raises(JitError, match="compares otherwise"):
        jitted(x, 3.0)


def test_keyword_arguments_are_read_like_positional_ones():
    x = Tensor(np.arange(4, dtype=np.float32))
    jitted = portkit.jit(lambda x, scale=1.0, shift=0.0: x * scale + shift)
    for k in range(5):
        np.testing.assert_array_equal(jitted(x, shift=1.0, scale=float(k)).numpy(),
                                      np.arange(4) * k + 1)
    assert jitted.plan is not None


def test_reading_a_replays_result_walks_no_graph(monkeypatch):
    x = Tensor(np.arange(4, dtype=np.float32))
    jitted = _replaying(lambda x, s: (x * s).relu(), x, 2.0)

    def no_walk(*args, **kwargs):
        raise AssertionError("realizing a computed tensor walked a graph")
    monkeypatch.setattr(portkit.graph, "walk", no_walk)
    result = jitted(x, 3.0)
    np.testing.assert_array_equal(result.realize().numpy(), np.arange(4) * 3)


def _counting_reads(monkeypatch) -> list[str]:
    """The names of the launch settings (PORTKIT_DEBUG, PORTKIT_CHECK) read from now on."""
    reads: list[str] = []
    read = settings.read

    def counted(name: str):
        if name in ("PORTKIT_DEBUG", "PORTKIT_CHECK"):
            reads.append(name)
        return read(name)
    monkeypatch.setattr(settings, "read", counted)
    return reads


def test_a_replay_reads_the_launch_settings_once_not_per_launch(monkeypatch, capsys):
    # set, so that both are read in full (unset, they are only looked up: see the next test)
    monkeypatch.setenv("PORTKIT_DEBUG", "0")
    monkeypatch.setenv("PORTKIT_CHECK", "0")
    step, _, _ = _training("sgd")
    jitted = portkit.jit(step)
    x, y = (Tensor(v).realize() for v in _batches(1)[0])
    while jitted.plan is None:
        jitted(x, y)
    assert len(jitted.plan.steps) > 3
    reads = _counting_reads(monkeypatch)
    jitted(x, y)
    assert sorted(reads) == ["PORTKIT_CHECK", "PORTKIT_DEBUG"]
    monkeypatch.setenv("PORTKIT_DEBUG", "2")       # a change still takes effect at the next call
    jitted(x, y)
    assert capsys.readouterr().err.count("portkit: ") >= len(jitted.plan.steps)


def test_unset_launch_settings_are_looked_up_without_os_environ_get(monkeypatch):
    """Unset (the usual case), a realize asks only whether they are there: os.environ.get of an
    unset name costs 0.6 us, a twentieth of a one-kernel replay."""
    monkeypatch.delenv("PORTKIT_DEBUG", raising=False)
    monkeypatch.delenv("PORTKIT_CHECK", raising=False)
    x = Tensor(np.arange(4, dtype=np.float32)).realize()
    (x + 1).realize()
    reads = _counting_reads(monkeypatch)
    assert settings.launch() == (0, "")
    np.testing.assert_array_equal((x + 1).numpy(), np.arange(4) + 1)
    assert reads == []
    monkeypatch.setenv("PORTKIT_CHECK", "interpreter")     # and a change is seen at once
    assert settings.launch() == (0, "interpreter")


def test_an_eager_realize_reads_the_launch_settings_once(monkeypatch):
    monkeypatch.setenv("PORTKIT_DEBUG", "0")
    monkeypatch.setenv("PORTKIT_CHECK", "0")
    x = Tensor(RNG.standard_normal((6, 5)).astype(np.float32)).realize()
    w = Tensor(RNG.standard_normal((5, 5)).astype(np.float32)).realize()
    for run in range(2):        # the first schedules and runs, the second replays
        reads = _counting_reads(monkeypatch)
        (((x @ w).relu() @ w).sum(1) * 2).realize()
        assert sorted(reads) == ["PORTKIT_CHECK", "PORTKIT_DEBUG"], run


def test_threads_replaying_one_function_keep_their_own_numbers(monkeypatch):
    """Each replay reads its own call's floats; they were kept on the Jit, shared by threads."""
    import threading
    import time

    from portkit.runtime import Runtime

    jitted = portkit.jit(lambda x, s: ((x * s).realize() + s).realize() * s)
    x = Tensor(np.arange(8, dtype=np.float32)).realize()
    while jitted.plan is None:
        jitted(x, 1.0)
    assert len(jitted.plan.steps) == 3
    launch_again = Runtime.launch_again

    def yielding(self, *args, **kwargs):
        time.sleep(0.002)            # another thread's replay starts between two launches
        return launch_again(self, *args, **kwargs)
    monkeypatch.setattr(Runtime, "launch_again", yielding)
    wrong: list[float] = []

    def run(s: float) -> None:
        for _ in range(5):
            got = jitted(x, s).numpy()
            if not np.array_equal(got, (np.arange(8, dtype=np.float32) * s + s) * s):
                wrong.append(s)

    threads = [threading.Thread(target=run, args=(float(k),)) for k in range(2, 6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


@pytest.mark.parametrize("convert", [float, round, int, math.floor, math.ceil, math.trunc],
                         ids=["float", "round", "int", "floor", "ceil", "trunc"])
def test_a_python_conversion_of_a_float_argument_is_refused_not_replayed_stale(convert):
    jitted = portkit.jit(lambda x, s: x * convert(s))
    x = Tensor(np.ones(3, np.float32)).realize()
    with pytest.raises(JitError, match=r"converts a float argument with .*\(\)"):
        jitted(x, 1.0)
    assert convert(portkit.jit.Number(2.5, lambda numbers: 2.5)) == convert(2.5)   # outside


def test_arithmetic_on_a_float_argument_still_follows_it():
    jitted = portkit.jit(lambda x, s: x * (s * 2 + 1) - abs(-s) ** 2)
    x = Tensor(np.ones(3, np.float32)).realize()
    for s in (1.0, 1.0, 3.0, 0.5):
        np.testing.assert_allclose(jitted(x, s).numpy(), np.full(3, s * 2 + 1 - s ** 2),
                                   rtol=1e-6)


@pytest.mark.parametrize("device", ["cpu", "opencl", "webgpu"])
def test_a_replay_writes_a_dead_intermediate_s_memory_again(device):
    # seven matmuls in a chain, each its own kernel and each output narrower than the last:
    # a plan owned seven buffers, one per launch; each output is dead once the next launch
    # has read it, so two blocks take turns, a narrower output in the first bytes of a wider
    # dead one (the working set a replay touches, and its memory, is what is alive at once),
    # in launch order on every device
    widths = [64, 64, 48, 40, 32, 24, 16, 8]
    w = [Tensor(RNG.standard_normal(shape).astype(np.float32) * 0.2, device=device)
         for shape in itertools.pairwise(widths)]

    def chain(x):
        for weight in w:
            x = (x @ weight).relu()
        return x.sum(1)

    jitted = portkit.jit(chain)
    for seed in range(4):
        x = np.random.default_rng(seed).standard_normal((32, 64)).astype(np.float32)
        np.testing.assert_array_equal(jitted(Tensor(x, device=device)).numpy(),
                                      chain(Tensor(x, device=device)).numpy())
    owned = [step for step in jitted.plan.steps if not step.fresh and step.compiled]
    assert len(owned) >= 7
    assert len(jitted.plan.blocks) == 2, jitted.plan.blocks
    handles = {id(block.handle) for block in jitted.plan.blocks}
    assert all(id(step.template[0].handle) in handles for step in owned)
