"""The activation, pool, pad, shuffle, loss, norm, dropout and container modules of portkit.nn,
made with the same arguments as their torch.nn namesakes, against PyTorch CPU on every backend
(forward and backward, state_dict names)."""
import numpy as np
import pytest

from portkit import nn
from portkit.tensor import Tensor

torch = pytest.importorskip("torch")
TNN = torch.nn

RNG = np.random.default_rng(31)


def _normal(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _tensor(namespace):
    return Tensor if namespace is nn else torch.tensor


def _labels(namespace, values):
    return Tensor(np.array(values, np.int32)) if namespace is nn else torch.tensor(values)


def _same_gradients(ours_inputs, theirs_inputs, ours, theirs):
    """The inputs' and the parameters' gradients of portkit's and torch's agree."""
    for o, t in zip(ours_inputs, theirs_inputs):
        np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), atol=1e-4)
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), atol=1e-4, err_msg=name)


W3 = np.array([0.5, 2.0, 1.0], np.float32)
PROBS = RNG.uniform(0.05, 0.95, (4, 3)).astype(np.float32)
BITS = (RNG.random((4, 3)) > 0.5).astype(np.float32)
SIGNS = np.sign(RNG.standard_normal((4, 6))).astype(np.float32)
COUNTS = np.floor(np.abs(RNG.standard_normal((4, 6))) * 3).astype(np.float32)
VARIANCE = (np.abs(RNG.standard_normal((4, 6))) + 0.1).astype(np.float32)
W6 = np.abs(RNG.standard_normal(6)).astype(np.float32)

# (id, make(namespace) -> module, input shapes, extra inputs(namespace) given after them)
CASES = [
    ("Identity", lambda m: m.Identity(3, unused=True), [(2, 3)], None),
    ("ReLU", lambda m: m.ReLU(), [(3, 4)], None),
    ("Hardsigmoid", lambda m: m.Hardsigmoid(), [(3, 4)], None),
    ("Hardtanh", lambda m: m.Hardtanh(-0.5, 0.8), [(3, 4)], None),
    ("SELU", lambda m: m.SELU(), [(3, 4)], None),
    ("CELU", lambda m: m.CELU(0.5), [(3, 4)], None),
    ("Softsign", lambda m: m.Softsign(), [(3, 4)], None),
    ("LogSigmoid", lambda m: m.LogSigmoid(), [(3, 4)], None),
    ("LogSoftmax", lambda m: m.LogSoftmax(dim=1), [(3, 4, 2)], None),
    ("Softmax", lambda m: m.Softmax(-1), [(3, 4)], None),
    ("GLU", lambda m: m.GLU(1), [(3, 4, 2)], None),
    ("Hardshrink", lambda m: m.Hardshrink(0.3), [(3, 4)], None),
    ("Softshrink", lambda m: m.Softshrink(lambd=0.3), [(3, 4)], None),
    ("Tanhshrink", lambda m: m.Tanhshrink(), [(3, 4)], None),
    ("Threshold", lambda m: m.Threshold(0.1, 20.0), [(3, 4)], None),
    ("AdaptiveAvgPool1d", lambda m: m.AdaptiveAvgPool1d(3), [(2, 3, 10)], None),
    ("AdaptiveAvgPool2d-1", lambda m: m.AdaptiveAvgPool2d(1), [(2, 3, 7, 7)], None),
    ("AdaptiveAvgPool2d", lambda m: m.AdaptiveAvgPool2d((5, 3)), [(2, 3, 8, 9)], None),
    ("AdaptiveAvgPool3d", lambda m: m.AdaptiveAvgPool3d((2, None, 3)), [(1, 2, 5, 3, 4)], None),
    ("AdaptiveMaxPool1d", lambda m: m.AdaptiveMaxPool1d(4), [(2, 3, 9)], None),
    ("AdaptiveMaxPool2d", lambda m: m.AdaptiveMaxPool2d((2, 3)), [(2, 3, 7, 8)], None),
    ("AdaptiveMaxPool3d", lambda m: m.AdaptiveMaxPool3d(2), [(1, 2, 4, 5, 4)], None),
    ("PixelShuffle", lambda m: m.PixelShuffle(2), [(2, 8, 3, 2)], None),
    ("PixelUnshuffle", lambda m: m.PixelUnshuffle(2), [(2, 2, 4, 6)], None),
    ("ChannelShuffle", lambda m: m.ChannelShuffle(2), [(2, 4, 3, 2)], None),
    ("Unflatten", lambda m: m.Unflatten(1, (2, 3)), [(4, 6, 2)], None),
    ("ZeroPad2d", lambda m: m.ZeroPad2d((1, 2, 0, 3)), [(2, 3, 4, 4)], None),
    ("ZeroPad1d", lambda m: m.ZeroPad1d(2), [(2, 3, 4)], None),
    ("ConstantPad2d", lambda m: m.ConstantPad2d(2, 3.5), [(2, 3, 4, 4)], None),
    ("ConstantPad1d", lambda m: m.ConstantPad1d((1, 2), -1.0), [(2, 3, 4)], None),
    ("ReflectionPad2d", lambda m: m.ReflectionPad2d((1, 2, 2, 1)), [(2, 3, 4, 4)], None),
    ("ReflectionPad1d", lambda m: m.ReflectionPad1d(2), [(2, 3, 4)], None),
    ("ReplicationPad2d", lambda m: m.ReplicationPad2d(2), [(2, 3, 4, 4)], None),
    ("ReplicationPad3d", lambda m: m.ReplicationPad3d(1), [(1, 2, 3, 3, 3)], None),
    ("CircularPad2d", lambda m: m.CircularPad2d(1), [(2, 3, 4, 4)], None),
    ("CosineSimilarity", lambda m: m.CosineSimilarity(dim=1), [(4, 5), (4, 5)], None),
    ("PairwiseDistance", lambda m: m.PairwiseDistance(p=1.0), [(4, 5), (4, 5)], None),
    ("MSELoss", lambda m: m.MSELoss(), [(4, 5), (4, 5)], None),
    ("MSELoss-sum", lambda m: m.MSELoss(reduction="sum"), [(4, 5), (4, 5)], None),
    ("L1Loss-none", lambda m: m.L1Loss(reduction="none"), [(4, 5), (4, 5)], None),
    ("L1Loss-legacy", lambda m: m.L1Loss(size_average=False), [(4, 5), (4, 5)], None),
    ("SmoothL1Loss", lambda m: m.SmoothL1Loss(beta=0.5), [(4, 5), (4, 5)], None),
    ("HuberLoss", lambda m: m.HuberLoss(delta=0.5), [(4, 5), (4, 5)], None),
    ("KLDivLoss", lambda m: m.KLDivLoss(reduction="batchmean", log_target=True),
     [(4, 5), (4, 5)], None),
    ("CrossEntropyLoss", lambda m: m.CrossEntropyLoss(weight=_tensor(m)(W3), ignore_index=1),
     [(4, 3)], lambda m: [_labels(m, [0, 1, 2, 2])]),
    ("CrossEntropyLoss-smooth", lambda m: m.CrossEntropyLoss(label_smoothing=0.1,
                                                             reduction="sum"),
     [(4, 3, 2)], lambda m: [_labels(m, [[0, 1], [2, 2], [1, 0], [0, 0]])]),
    ("NLLLoss", lambda m: m.NLLLoss(_tensor(m)(W3), reduction="none"), [(4, 3)],
     lambda m: [_labels(m, [0, 1, 2, 2])]),
    ("BCELoss", lambda m: m.BCELoss(weight=_tensor(m)(W3)), None,
     lambda m: [_tensor(m)(BITS)]),
    ("LPPool2d", lambda m: m.LPPool2d(2, 2), [(2, 3, 6, 4)], None),
    ("LocalResponseNorm", lambda m: m.LocalResponseNorm(3), [(2, 5, 4)], None),
    ("UpsamplingNearest2d", lambda m: m.UpsamplingNearest2d(scale_factor=2), [(1, 2, 3, 3)],
     None),
    ("UpsamplingBilinear2d", lambda m: m.UpsamplingBilinear2d(size=(5, 4)), [(1, 2, 3, 3)],
     None),
    ("Bilinear", lambda m: m.Bilinear(3, 4, 2), [(5, 3), (5, 4)], None),
    ("SoftMarginLoss", lambda m: m.SoftMarginLoss(), [(4, 6)], lambda m: [_tensor(m)(SIGNS)]),
    ("HingeEmbeddingLoss", lambda m: m.HingeEmbeddingLoss(margin=0.5), [(4, 6)],
     lambda m: [_tensor(m)(SIGNS)]),
    ("MarginRankingLoss", lambda m: m.MarginRankingLoss(0.2), [(4, 6), (4, 6)],
     lambda m: [_tensor(m)(SIGNS)]),
    ("CosineEmbeddingLoss", lambda m: m.CosineEmbeddingLoss(reduction="sum"), [(4, 6), (4, 6)],
     lambda m: [_tensor(m)(SIGNS[:, 0])]),
    ("TripletMarginLoss", lambda m: m.TripletMarginLoss(margin=0.5, p=1), [(4, 6)] * 3, None),
    ("PoissonNLLLoss", lambda m: m.PoissonNLLLoss(full=True), [(4, 6)],
     lambda m: [_tensor(m)(COUNTS)]),
    ("GaussianNLLLoss", lambda m: m.GaussianNLLLoss(eps=1e-3), [(4, 6), (4, 6)],
     lambda m: [_tensor(m)(VARIANCE)]),
    ("MultiLabelSoftMarginLoss", lambda m: m.MultiLabelSoftMarginLoss(weight=_tensor(m)(W6)),
     [(4, 6)], lambda m: [_tensor(m)((SIGNS > 0).astype(np.float32))]),
    ("BCEWithLogitsLoss", lambda m: m.BCEWithLogitsLoss(pos_weight=_tensor(m)(W3)), [(4, 3)],
     lambda m: [_tensor(m)(BITS)]),
]


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("make, shapes, extra", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_module_matches_torch(make, shapes, extra, check):
    ours, theirs = make(nn), make(TNN)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    arrays = [PROBS] if shapes is None else [_normal(*s, scale=2) for s in shapes]
    more = {nn: extra(nn), TNN: extra(TNN)} if extra else {nn: [], TNN: []}
    check(lambda *t: ours(*t, *more[nn]), *arrays, torch_fn=lambda *t: theirs(*t, *more[TNN]))
    assert list(ours.state_dict()) == list(theirs.state_dict())


def test_inplace_arguments_are_accepted():
    x = _normal(3, 4)
    for make in [lambda m: m.ReLU(inplace=True), lambda m: m.ReLU6(inplace=True),
                 lambda m: m.Hardtanh(inplace=True), lambda m: m.SELU(True),
                 lambda m: m.Threshold(0.0, 1.0, True), lambda m: m.Dropout(0.5, True)]:
        np.testing.assert_allclose(make(nn).eval()(Tensor(x)).numpy(),
                                   make(TNN).eval()(torch.tensor(x)).numpy(), atol=1e-6)


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("dims", [1, 2])
@pytest.mark.parametrize("affine, track", [(False, False), (True, False), (True, True),
                                           (False, True)])
def test_instance_norm_modules(dims, affine, track, check):
    name = f"InstanceNorm{dims}d"
    ours = getattr(nn, name)(3, affine=affine, track_running_stats=track, momentum=0.2)
    theirs = getattr(TNN, name)(3, affine=affine, track_running_stats=track, momentum=0.2)
    if affine:
        with torch.no_grad():
            theirs.weight.copy_(torch.tensor(_normal(3)))
            theirs.bias.copy_(torch.tensor(_normal(3)))
        ours.load_state_dict({"weight": theirs.weight.detach().numpy(),
                              "bias": theirs.bias.detach().numpy()}, strict=False)
    assert set(ours.state_dict()) == set(theirs.state_dict()) - {"num_batches_tracked"}
    x = _normal(2, 3, *(5,) * dims)
    check(lambda t: ours(t), x, torch_fn=lambda t: theirs(t))
    check(lambda t: ours(t), x[0], torch_fn=lambda t: theirs(t))      # unbatched
    for key in ("running_mean", "running_var") if track else ():
        np.testing.assert_allclose(ours.state_dict()[key].numpy(),
                                   theirs.state_dict()[key].numpy(), atol=1e-5)
    ours.eval()
    theirs.eval()
    check(lambda t: ours(t), x, torch_fn=lambda t: theirs(t))
    assert repr(ours) == repr(theirs)
    with pytest.raises(ValueError, match="expected"):
        ours(Tensor(_normal(*(2,) * (dims + 3))))


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("name, shape", [("Dropout1d", (4, 8, 3)), ("Dropout2d", (4, 8, 3, 2)),
                                         ("Dropout3d", (2, 8, 2, 2, 2))])
def test_channel_dropout_modules(name, shape):
    x = np.abs(_normal(*shape)) + 1
    module = getattr(nn, name)(p=0.5)
    out = module(Tensor(x)).numpy()
    zeroed = (out == 0).reshape(*shape[:2], -1)
    assert (zeroed.all(-1) | ~zeroed.any(-1)).all()
    module.eval()
    np.testing.assert_array_equal(module(Tensor(x)).numpy(), x)


class _Ours(nn.Module):
    def __init__(self):
        self.blocks = nn.ModuleDict({"a": nn.Linear(3, 4), "b": nn.Linear(4, 2)})
        self.scales = nn.ParameterList([Tensor(np.ones(4, np.float32)),
                                        Tensor(np.ones(2, np.float32))])
        self.shift = nn.ParameterDict({"out": Tensor(np.zeros(2, np.float32))})

    def forward(self, x):
        x = self.blocks["a"](x) * self.scales[0]
        return self.blocks["b"](x) * self.scales[1] + self.shift["out"]


class _Theirs(TNN.Module):
    def __init__(self):
        super().__init__()
        self.blocks = TNN.ModuleDict({"a": TNN.Linear(3, 4), "b": TNN.Linear(4, 2)})
        self.scales = TNN.ParameterList([TNN.Parameter(torch.randn(4)),
                                         TNN.Parameter(torch.randn(2))])
        self.shift = TNN.ParameterDict({"out": TNN.Parameter(torch.randn(2))})

    def forward(self, x):
        x = self.blocks["a"](x) * self.scales[0]
        return self.blocks["b"](x) * self.scales[1] + self.shift["out"]


@pytest.mark.usefixtures("backend")
def test_module_dict_and_parameter_containers():
    ours, theirs = _Ours(), _Theirs()
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    ours.load_state_dict({n: p.detach().numpy() for n, p in theirs.state_dict().items()})
    x = _normal(5, 3)
    t = torch.tensor(x)
    ours_out, theirs_out = ours(Tensor(x)), theirs(t)
    np.testing.assert_allclose(ours_out.numpy(), theirs_out.detach().numpy(), atol=1e-5)
    ours_out.sum().backward()
    theirs_out.sum().backward()
    _same_gradients([], [], ours, theirs)
    blocks = ours.blocks
    assert list(blocks) == ["a", "b"] and len(blocks) == 2 and "a" in blocks
    blocks["c"] = nn.ReLU()
    assert list(blocks.keys()) == ["a", "b", "c"] and isinstance(blocks.pop("c"), nn.ReLU)
    assert [k for k, _ in ours.named_children()] == ["blocks", "scales", "shift"]
    ours.eval()
    assert not blocks["a"].training
    ours.scales.append(Tensor(np.ones(3, np.float32)))
    assert "scales.2" in ours.state_dict() and len(ours.scales) == 3


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("kind, kwargs, shape", [
    ("LSTM", {}, (5, 2, 3)),
    ("GRU", {"num_layers": 2, "bidirectional": True}, (4, 2, 3)),
    ("RNN", {"nonlinearity": "relu", "batch_first": True, "bias": False}, (2, 4, 3)),
    ("LSTM", {"bidirectional": True, "batch_first": True}, (4, 3)),          # unbatched
], ids=str)
def test_recurrent_layers(kind, kwargs, shape):
    ours, theirs = getattr(nn, kind)(3, 4, **kwargs), getattr(TNN, kind)(3, 4, **kwargs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert repr(ours) == repr(theirs)
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    x = _normal(*shape)
    layers = theirs.num_layers * (2 if theirs.bidirectional else 1)
    batch = () if len(shape) == 2 else (shape[0 if theirs.batch_first else 1],)
    h0 = _normal(layers, *batch, 4)
    given = (h0, _normal(*h0.shape)) if kind == "LSTM" else (h0,)
    xo = Tensor(x, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    state_o = [Tensor(s, requires_grad=True) for s in given]
    state_t = [torch.tensor(s, requires_grad=True) for s in given]
    yo, ho = ours(xo, tuple(state_o) if kind == "LSTM" else state_o[0])
    yt, ht = theirs(xt, tuple(state_t) if kind == "LSTM" else state_t[0])
    np.testing.assert_allclose(yo.numpy(), yt.detach().numpy(), atol=1e-5)
    for o, t in zip(ho if kind == "LSTM" else (ho,), ht if kind == "LSTM" else (ht,)):
        np.testing.assert_allclose(o.numpy(), t.detach().numpy(), atol=1e-5)
    weights = _normal(*yt.shape)
    last_o = ho[-1] if kind == "LSTM" else ho
    last_t = ht[-1] if kind == "LSTM" else ht
    ((yo * Tensor(weights)).sum() + last_o.sum()).backward()
    ((yt * torch.tensor(weights)).sum() + last_t.sum()).backward()
    _same_gradients([xo, *state_o], [xt, *state_t], ours, theirs)


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("batch_first, shapes, masks, kwargs", [
    (False, [(5, 2, 8), (6, 2, 8), (6, 2, 8)], {}, {}),
    (True, [(2, 5, 8), (2, 6, 8), (2, 6, 8)],
     {"key_padding_mask": np.array([[False] * 5 + [True], [False] * 6])},
     {"average_attn_weights": False}),
    (False, [(4, 1, 8)] * 3, {"attn_mask": np.triu(np.ones((4, 4), bool), 1)},
     {"is_causal": True}),
    (False, [(4, 8)] * 3, {"attn_mask": _normal(2, 4, 4)}, {}),                   # unbatched
    (True, [(2, 3, 8)] * 3, {}, {"need_weights": False}),
], ids=str)
def test_multihead_attention(batch_first, shapes, masks, kwargs):
    ours = nn.MultiheadAttention(8, 2, batch_first=batch_first)
    theirs = TNN.MultiheadAttention(8, 2, batch_first=batch_first)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    arrays = [_normal(*s) for s in shapes]
    xo = [Tensor(a, requires_grad=True) for a in arrays]
    xt = [torch.tensor(a, requires_grad=True) for a in arrays]
    out_o, weights_o = ours(*xo, **{k: Tensor(v) for k, v in masks.items()}, **kwargs)
    out_t, weights_t = theirs(*xt, **{k: torch.tensor(v) for k, v in masks.items()}, **kwargs)
    np.testing.assert_allclose(out_o.numpy(), out_t.detach().numpy(), atol=1e-5)
    if weights_t is None:
        assert weights_o is None
    else:
        np.testing.assert_allclose(weights_o.numpy(), weights_t.detach().numpy(), atol=1e-5)
    out_o.sum().backward()
    out_t.sum().backward()
    _same_gradients(xo, xt, ours, theirs)


@pytest.mark.usefixtures("backend")
@pytest.mark.parametrize("kwargs, masks", [
    ({}, {}),
    ({"norm_first": True, "activation": "gelu", "batch_first": True},
     {"src_key_padding_mask": np.array([[False] * 4 + [True], [False] * 5])}),
    ({"dim_feedforward": 6}, {"mask": np.triu(np.full((5, 5), -np.inf, np.float32), 1)}),
], ids=str)
def test_transformer_encoder(kwargs, masks):
    def make(m):
        layer = m.TransformerEncoderLayer(8, 2, dropout=0.0, **{"dim_feedforward": 16, **kwargs})
        return m.TransformerEncoder(layer, 2, norm=m.LayerNorm(8))
    ours, theirs = make(nn), make(TNN)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: v.detach().numpy() for k, v in theirs.state_dict().items()})
    x = _normal(2, 5, 8) if kwargs.get("batch_first") else _normal(5, 2, 8)
    xo, xt = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out_o = ours(xo, **{k: Tensor(v) for k, v in masks.items()})
    out_t = theirs(xt, **{k: torch.tensor(v) for k, v in masks.items()})
    np.testing.assert_allclose(out_o.numpy(), out_t.detach().numpy(), atol=1e-4)
    weights = _normal(*x.shape)
    (out_o * Tensor(weights)).sum().backward()
    (out_t * torch.tensor(weights)).sum().backward()
    _same_gradients([xo], [xt], ours, theirs)
