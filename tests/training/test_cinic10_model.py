"""The CIFAR-style ResNet-18."""

from __future__ import annotations

import pytest
import torch

from pdl_cinic10.model import ResNet18


@pytest.mark.unit
@pytest.mark.parametrize("width", [16, 64])
def test_logits_shape(width):
    model = ResNet18(width=width).eval()
    with torch.no_grad():
        assert model(torch.randn(3, 3, 32, 32)).shape == (3, 10)


@pytest.mark.unit
def test_standard_width_has_the_resnet18_parameter_count():
    # 11,173,962 is the well-known count of the CIFAR ResNet-18 (3x3 stem, no max-pool).
    assert sum(p.numel() for p in ResNet18().parameters()) == 11_173_962


@pytest.mark.unit
def test_stages_downsample_32_to_4_and_head_sees_8x_width():
    model = ResNet18(num_classes=7, width=8)
    features = model.stages(model.stem(torch.randn(2, 3, 32, 32)))
    assert features.shape == (2, 64, 4, 4)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 7)


@pytest.mark.unit
def test_rejects_bad_width():
    with pytest.raises(ValueError, match="width must be >= 1"):
        ResNet18(width=0)
