"""print(model) shows the module tree as torch prints it."""
import torch

from portkit import nn


class Net(nn.Module):
    def __init__(self, framework):
        self.features = framework.Sequential(framework.Conv2d(3, 8, 3, stride=2, padding=1),
                                             framework.ReLU())
        self.blocks = framework.ModuleList([framework.LayerNorm(8), framework.Dropout(0.25)])
        self.head = framework.Linear(8, 10)


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        Net.__init__(self, torch.nn)


def test_a_model_prints_as_torch_prints_it():
    expected = repr(TorchNet()).replace(", inplace=False", "").replace("affine=True, bias=True)", "affine=True)")
    assert repr(Net(nn)).replace("Net(", "TorchNet(", 1) == expected


def test_layers_print_their_settings_as_torch():
    pairs = [(nn.Conv2d(4, 8, (3, 5), dilation=2, groups=2, bias=False),
              torch.nn.Conv2d(4, 8, (3, 5), dilation=2, groups=2, bias=False)),
             (nn.ConvTranspose1d(6, 3, 2, stride=2, output_padding=1),
              torch.nn.ConvTranspose1d(6, 3, 2, stride=2, output_padding=1)),
             (nn.Embedding(10, 4, padding_idx=0), torch.nn.Embedding(10, 4, padding_idx=0)),
             (nn.Linear(3, 2, bias=False), torch.nn.Linear(3, 2, bias=False)),
             (nn.PReLU(3), torch.nn.PReLU(3)), (nn.ReLU(), torch.nn.ReLU())]
    for ours, theirs in pairs:
        assert repr(ours) == repr(theirs)


def test_train_and_eval_reach_every_child():
    model = Net(nn)
    model.eval()
    assert not model.blocks[1].training and not model.features[1].training
    model.train()
    assert model.blocks[1].training
