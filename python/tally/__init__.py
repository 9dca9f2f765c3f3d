"""Tally's Python side: the stub process that runs a user's model class for tally-worker.

A model is a plain class; nothing here needs importing to write one:

    class Model:
        num_classes = 3                 # optional; else --num-classes N for label-map outputs
        outputs_probabilities = False   # optional; single-score outputs are probabilities (> 0.5)
        def __init__(self, devices, options): ...
        def predict(self, images, rows): ...   # one output per image

See README "Python models" for the contract. This package needs numpy only; torch is used when
the model returns torch tensors.
"""

__all__ = ["stub"]
