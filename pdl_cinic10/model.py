"""CIFAR-style ResNet-18: 3x3 stem, no max-pool, 4 stages of 2 BasicBlocks."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["BasicBlock", "ResNet18"]


def _conv_bn(c_in: int, c_out: int, *, kernel: int = 3, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=kernel // 2, bias=False),
        nn.BatchNorm2d(c_out),
    )


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers plus a shortcut (1x1 conv-BN when the shape changes)."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1):
        super().__init__()
        self.conv1 = _conv_bn(c_in, c_out, stride=stride)
        self.conv2 = _conv_bn(c_out, c_out)
        reshapes = stride != 1 or c_in != c_out
        self.shortcut = _conv_bn(c_in, c_out, kernel=1, stride=stride) if reshapes else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv2(torch.relu(self.conv1(x)))
        return torch.relu(out + self.shortcut(x))


class ResNet18(nn.Module):
    """Logits [B, num_classes] for float images [B, 3, 32, 32].

    Stages have width, 2*width, 4*width, 8*width channels (strides 1, 2, 2, 2);
    width=64 is the standard model, a small width (e.g. 16) is fast on a CPU.
    """

    def __init__(self, num_classes: int = 10, width: int = 64):
        super().__init__()
        if num_classes < 1 or width < 1:
            raise ValueError(f"num_classes and width must be >= 1; got {num_classes}, {width}")
        self.stem = nn.Sequential(_conv_bn(3, width), nn.ReLU(inplace=True))
        stages, c_in = [], width
        for multiple, stride in [(1, 1), (2, 2), (4, 2), (8, 2)]:
            c_out = width * multiple
            stages.append(nn.Sequential(BasicBlock(c_in, c_out, stride), BasicBlock(c_out, c_out)))
            c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))
