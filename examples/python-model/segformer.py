"""A Hugging Face transformers SegFormer built from a config (random weights, no download), for GPU
machines: the shape of a real `from_pretrained` model behind Tally's Python backend.

    tally run --model examples/python-model/segformer.py --manifest data.csv --out results/ --gpus all \
        --model-option num_labels=3 --model-option device_map=auto   # spread over --gpus-per-worker GPUs

Options: num_labels (default 3), dtype (float32 | bfloat16 | float16), device_map (none | auto: let
accelerate spread the layers over every device this worker owns, with max_memory per GPU).
"""
import torch
import torch.nn.functional as F

import tally


class Model:
    def __init__(self, devices, options):
        from transformers import SegformerConfig, SegformerForSemanticSegmentation

        self.num_classes = int(options.get("num_labels", "3"))
        dtype = getattr(torch, options.get("dtype", "float32"))
        torch.manual_seed(int(options.get("seed", "0")))
        config = SegformerConfig(num_labels=self.num_classes)
        model = SegformerForSemanticSegmentation(config).eval().to(dtype)
        self.devices = devices
        if options.get("device_map", "none") == "auto" and len(devices) > 1:
            from accelerate import dispatch_model, infer_auto_device_map

            # Even split: each GPU gets a share of the weights, as device_map="auto" with max_memory.
            size = sum(p.numel() * p.element_size() for p in model.parameters())
            per_gpu = int(size / len(devices) * 1.2) + (1 << 20)
            max_memory = {int(d.split(":")[1]): per_gpu for d in devices}
            device_map = infer_auto_device_map(model, max_memory=max_memory,
                                               no_split_module_classes=["SegformerLayer"])
            self.model = dispatch_model(model, device_map=device_map)
            self.input_device = torch.device(devices[0])
        else:
            self.input_device = torch.device(devices[0])
            self.model = model.to(self.input_device)
        self.dtype = dtype
        self.mean = torch.tensor([0.485, 0.456, 0.406], device=self.input_device).view(1, 3, 1, 1)
        self.std = torch.tensor([0.229, 0.224, 0.225], device=self.input_device).view(1, 3, 1, 1)

    def predict(self, images, rows):
        # Contiguous N x 3 x H x W in [0, 1] (tally.to_tensor: a permuted tensor would run channels-last).
        x = tally.to_tensor(images, self.input_device).sub_(self.mean).div_(self.std).to(self.dtype)
        logits = self.model(pixel_values=x).logits  # [N, C, H/4, W/4]
        logits = F.interpolate(logits.float(), size=x.shape[-2:], mode="bilinear", align_corners=False)
        return list(logits)
