"""Tier 5, models: an MLP trained a few SGD steps, a small CNN and a transformer block.

Each model starts from the same numpy weights on the backend (float32) and on the CPU reference
in float64, runs forward and backward (and, for the MLP, SGD steps), and every loss, output,
gradient and trained weight must agree within a normwise bound (docs/conformance.md):
    max|q - q_ref| <= (U * eps + gamma_n) * max|q_ref| * (1 + step)
U sums (ULP budget + 1) over the rounding ops of the kernels the model runs (as tier 4), n is
the model's longest sum, and each SGD step before q adds the error of the step it builds on.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from portkit.abi import dtypes
from portkit.abi.errors import UnsupportedDType
from portkit.conformance.case import Case, Context, Outcome, Status, TierNotRun, Unsupported
from portkit.conformance.tensor_ops import gamma
from portkit.conformance.tier4_tensor import machine_eps, rounding_units, stack_device

TIER = 5
NAME = "models"
F32, F64 = dtypes.float32, dtypes.float64


@dataclass(frozen=True)
class Model:
    """A model: its numpy weights and data, and a run that returns named results."""

    name: str
    weights: Callable[[np.random.Generator], dict[str, np.ndarray]]
    run: Callable[..., dict[str, Any]]     # (weights, device, dtype, plan) -> results
    longest_sum: int
    tier4: tuple[str, ...]      # the Tensor ops it is built from (tier 4 case names)


def _tensors(weights: dict[str, np.ndarray], device: str, dtype: dtypes.DType) -> dict:
    from portkit.tensor import Tensor

    return {k: Tensor(v.astype(dtype.np) if v.dtype.kind == "f" else v, device=device,
                      requires_grad=v.dtype.kind == "f" and not k.startswith("x"))
            for k, v in weights.items()}


def _results(named: dict[str, Any], plan: bool) -> dict[str, Any]:
    """{name: numpy array}, or with `plan`, {name: U of the kernels it needs}."""
    from portkit.tensor import realize

    if plan:
        return {k: rounding_units(t.schedule()) for k, t in named.items()}
    realize(*named.values())
    return {k: t.numpy() for k, t in named.items()}


def _mlp_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((16, 12)), "labels": rng.integers(0, 5, 16).astype(np.int32),
            "w1": rng.standard_normal((24, 12)) * 0.3, "b1": rng.standard_normal(24) * 0.1,
            "w2": rng.standard_normal((5, 24)) * 0.3, "b2": rng.standard_normal(5) * 0.1}


def _mlp(steps: int) -> Callable[[dict, str, dtypes.DType, bool], dict]:
    def run(weights: dict, device: str, dtype: dtypes.DType, plan: bool) -> dict:
        from portkit import optim

        t = _tensors(weights, device, dtype)
        params = [t["w1"], t["b1"], t["w2"], t["b2"]]
        opt = optim.SGD(params, lr=0.1)
        out: dict[str, Any] = {}
        for step in range(steps):
            opt.zero_grad()
            logits = t["x"].linear(t["w1"], t["b1"]).relu().linear(t["w2"], t["b2"])
            loss = logits.cross_entropy(t["labels"])
            loss.backward()
            if plan:    # U of one step: each later step adds as much again (the 1 + step)
                return _results({"loss": loss, "w1": t["w1"].grad, "b1": t["b1"].grad,
                                 "w2": t["w2"].grad, "b2": t["b2"].grad}, True)
            out[f"loss[{step}]"] = loss.numpy()
            opt.step()
        out.update(_results({"w1": t["w1"], "b1": t["b1"], "w2": t["w2"], "b2": t["b2"]},
                            False))
        return out
    return run


def _cnn_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((2, 1, 8, 8)), "labels": np.array([1, 3], np.int32),
            "k": rng.standard_normal((4, 1, 3, 3)) * 0.5, "kb": rng.standard_normal(4) * 0.1,
            "w": rng.standard_normal((5, 64)) * 0.2, "b": rng.standard_normal(5) * 0.1}


def _cnn(weights: dict, device: str, dtype: dtypes.DType, plan: bool) -> dict:
    t = _tensors(weights, device, dtype)
    h = t["x"].conv2d(t["k"], t["kb"], padding=1).relu().max_pool2d(2)
    logits = h.flatten(1).linear(t["w"], t["b"])
    loss = logits.cross_entropy(t["labels"])
    loss.backward()
    return _results({"logits": logits, "loss": loss, "grad k": t["k"].grad,
                     "grad kb": t["kb"].grad, "grad w": t["w"].grad}, plan)


D, HEADS, SEQ = 16, 2, 6


def _block_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    def dense(n_out: int, n_in: int) -> np.ndarray:
        return rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)

    return {"x": rng.standard_normal((2, SEQ, D)), "x_w": rng.standard_normal((2, SEQ, D)),
            "qkv": dense(3 * D, D), "proj": dense(D, D), "up": dense(2 * D, D),
            "down": dense(D, 2 * D), "ln1": 1 + 0.1 * rng.standard_normal(D),
            "ln2": 1 + 0.1 * rng.standard_normal(D)}


def _block(weights: dict, device: str, dtype: dtypes.DType, plan: bool) -> dict:
    """Pre-norm block: x + attn(ln(x)), then + mlp(ln(.)); causal attention, 2 heads."""
    t = _tensors(weights, device, dtype)
    x = t["x"]
    batch = x.shape[0]
    q, k, v = (x.layernorm() * t["ln1"]).linear(t["qkv"]).chunk(3, -1)
    q, k, v = (z.reshape(batch, SEQ, HEADS, D // HEADS).transpose(1, 2) for z in (q, k, v))
    attn = q.scaled_dot_product_attention(k, v, is_causal=True)
    x = x + attn.transpose(1, 2).reshape(batch, SEQ, D).linear(t["proj"])
    out = x + (x.layernorm() * t["ln2"]).linear(t["up"]).gelu().linear(t["down"])
    (out * t["x_w"]).sum().backward()
    return _results({"out": out, "grad qkv": t["qkv"].grad, "grad proj": t["proj"].grad,
                     "grad up": t["up"].grad, "grad ln1": t["ln1"].grad}, plan)


def models(quick: bool) -> list[Model]:
    """The model table; `quick` trains the MLP for fewer steps."""
    return [
        Model("mlp-sgd", _mlp_weights, _mlp(2 if quick else 4), 24,
              ("matmul", "add", "relu", "cross-entropy")),
        Model("cnn", _cnn_weights, _cnn, 64,
              ("conv2d", "relu", "max-pool2d", "matmul", "cross-entropy")),
        Model("transformer", _block_weights, _block, 2 * D,
              ("layernorm", "matmul", "matmul-batched", "softmax", "permute", "mul")),
    ]


def _compare(model: Model, ours: dict, reference: dict, units: dict[str, float]) -> Outcome:
    """Judges every result against the float64 reference under the normwise bound; a trained
    weight counts every step of the run, and U is that of the kernels behind its gradient."""
    bad, worst_ratio, worst_error = [], 0.0, 0.0
    steps = sum(name.startswith("loss[") for name in reference)
    for name, ref in reference.items():
        base = name.split("[")[0]
        step = int(name[len(base) + 1:-1]) if "[" in name else steps
        scale = units[base] * machine_eps(F32) + gamma(model.longest_sum, machine_eps(F32))
        got = np.asarray(ours[name], np.float64)
        error = np.abs(got - ref)
        bound = scale * max(float(np.abs(ref).max()), np.finfo(np.float32).tiny) * (1 + step)
        index = np.unravel_index(int(np.argmax(error)), error.shape) if error.size else ()
        worst = float(error.max()) if error.size else 0.0
        worst_error = max(worst_error, worst)
        worst_ratio = max(worst_ratio, worst / bound)
        if not worst <= bound:
            bad.append(f"{name}{list(index)}: expected {float(ref[index]):.7g}, actual "
                       f"{float(got[index]):.7g}, |error| {worst:.3g} (bound {bound:.3g})")
    if bad:
        return Outcome(Status.FAILED, f"{len(bad)} of {len(reference)} results disagree with "
                       "the CPU reference in float64: " + "; ".join(bad), max_error=worst_error)
    return Outcome(Status.PASSED, f"worst error {worst_ratio:.2g} of its bound",
                   max_error=worst_error)


def _case(ctx: Context, model: Model) -> Case:
    case_id = f"models/{model.name}/float32"

    def fn(target: Any) -> Outcome:
        from portkit.conformance.target import Target

        weights = model.weights(ctx.rng(case_id))
        device = stack_device(target)
        try:
            units = model.run(weights, device, F32, True)
            ours = model.run(weights, device, F32, False)
        except UnsupportedDType as why:
            raise Unsupported(str(why)) from None
        reference = model.run(weights, stack_device(Target.load("cpu")), F64, False)
        outcome = _compare(model, ours, reference, units)
        if outcome.status is Status.FAILED:
            outcome.replay = f"portkit conform --backend {target.name} --tier 5 -k {case_id}"
        return outcome

    requires = tuple(f"tensor/{op}/float32/*" for op in model.tier4)
    return Case(case_id, TIER, model.name, "float32", requires, fn=fn)


def cases(ctx: Context) -> list[Case]:
    """One case per model; needs the Tensor stack and the CPU reference (in float64)."""
    for module in ("portkit.tensor", "portkit.nn", "portkit.optim"):
        try:
            __import__(module)
        except ImportError as error:
            raise TierNotRun(f"needs {module}, which does not import here ({error})") from None
    return [_case(ctx, model) for model in models(ctx.quick)]
