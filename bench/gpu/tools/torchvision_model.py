"""torchvision's LRASPP-MobileNetV3 or DeepLabV3-ResNet50 in eager mode, as a Tally Python model: the
same models, seeds and preprocessing as bench/gpu/tools/export_models.py's TorchScript files, for
comparing the two backends (bench/gpu/run.sh python).

Options: arch=lraspp|deeplabv3, precision=fp32|bf16.
"""
import torch
from torchvision.models.segmentation import deeplabv3_resnet50, lraspp_mobilenet_v3_large

import tally


class Model:
    num_classes = 2

    def __init__(self, devices, options):
        ctor = {"lraspp": lraspp_mobilenet_v3_large, "deeplabv3": deeplabv3_resnet50}[options.get("arch", "lraspp")]
        torch.manual_seed(0)
        self.device = torch.device(devices[0])
        self.model = ctor(weights=None, weights_backbone=None, num_classes=2).eval().to(self.device)
        self.bf16 = options.get("precision", "fp32") == "bf16"

    def predict(self, images, rows):
        # One asynchronous upload of Tally's (page-locked) buffer, then NCHW and [0, 1] on the GPU:
        # contiguous, as the TorchScript backend feeds the model (a permuted, channels-last input
        # makes eager LRASPP run channels-last: 1662 instead of 2292 img/s on an H100).
        x = tally.to_tensor(images, self.device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.bf16):
            return self.model(x)["out"]  # N x 2 x H x W: Tally takes the argmax on the GPU
