"""The demo model (examples/demo/model.pt) as a Python model: the same 3x3 mean filter and 1x1 head,
run by torch in eager mode. Its per_image.csv equals the TorchScript demo's:

    tally run --model examples/python-model/colour_segmenter.py --manifest examples/demo/manifest.csv \
        --out results/ --python /usr/bin/python3
"""
import numpy as np
import torch


class Model:
    # No num_classes needed: the model returns 3 score channels per image (argmax).

    def __init__(self, devices, options):
        self.device = torch.device(devices[0])
        smooth = torch.full((3, 1, 3, 3), 1.0 / 9.0)
        head_w = torch.zeros(3, 3, 1, 1)
        head_b = torch.zeros(3)
        # class 1 (red): 8 * (r - b) - 1.5 ; class 2 (blue): 8 * (b - r) - 1.5
        head_w[1, 0, 0, 0], head_w[1, 2, 0, 0], head_b[1] = 8.0, -8.0, -1.5
        head_w[2, 2, 0, 0], head_w[2, 0, 0, 0], head_b[2] = 8.0, -8.0, -1.5
        self.smooth = torch.nn.Conv2d(3, 3, 3, padding=1, groups=3, bias=False)
        self.head = torch.nn.Conv2d(3, 3, 1)
        with torch.no_grad():
            self.smooth.weight.copy_(smooth)
            self.head.weight.copy_(head_w)
            self.head.bias.copy_(head_b)
        self.net = torch.nn.Sequential(self.smooth, self.head).eval().to(self.device)

    def predict(self, images, rows):
        # Tally batches images of one size together; stack them as the TorchScript path does.
        x = torch.from_numpy(np.stack(images)).to(self.device)
        x = x.permute(0, 3, 1, 2).contiguous().to(torch.float32).div_(255.0)  # NCHW, not channels-last
        return list(self.net(x))  # One 3 x H x W score tensor per image.
