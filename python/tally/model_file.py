"""Importing a Python model file (--model file.py[:Class]): the stub's model and tally export's."""

import importlib.util
import os
import sys


class NoSuchClass(Exception):
    """The model file imported but defines no class of the name asked for."""


def load_model_class(path, class_name):
    """The class `class_name` of the Python model file `path`, imported as tally_user_model with its
    folder on sys.path (the stub's model, and tally export's). Raises what importing the file
    raises, or NoSuchClass naming the classes it defines."""
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location("tally_user_model", path)
    if spec is None or spec.loader is None:
        raise ImportError("cannot import %s as a Python module" % path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["tally_user_model"] = module
    spec.loader.exec_module(module)
    cls = getattr(module, class_name, None)
    if cls is None:
        classes = sorted(n for n, v in vars(module).items() if isinstance(v, type) and v.__module__ == module.__name__)
        raise NoSuchClass("%s defines no class '%s' (it defines: %s)" % (path, class_name, ", ".join(classes) or "no classes"))
    return cls
