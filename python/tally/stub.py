"""The stub process of Tally's Python model backend (run as `python -m tally.stub` by tally-worker).

The worker talks to this process over a Unix socket (file descriptor $TALLY_STUB_FD): JSON
messages (the StubRequest / StubResponse protos of proto/tally.proto), each framed by a 4-byte
little-endian length. Pixels never cross the socket: the worker passes memfd buffers once
(SCM_RIGHTS, "map"), puts each batch's decoded images in one of them and names, per request, the
buffer the outputs go to. Outputs are canonicalised here, on the model's own device when it
returns torch tensors:

  * HxW (or 1xHxW) integers or bools  -> "labels": uint16 class labels, as given
  * CxHxW floats, C >= 2              -> "argmax": uint16 argmax over C (first maximum on ties)
  * HxW or 1xHxW floats               -> "score":  float32 single foreground score

and the worker computes every count and metric from them. Volume jobs send one volume per
"predict_volume" request (C x D x H x W voxels, the row with "spacing" and "affine"); its output is
D x H x W labels or C x D x H x W scores, written back as uint16 labels. Requests are answered in
order.
"""

import array
import collections
import contextlib
import json
import mmap
import os
import queue
import signal
import socket
import struct
import sys
import threading
import time
import traceback

import numpy as np

from tally.bytecode import keep_bytecode
from tally.compile_trial import phase as _phase  # TALLY_STUB_PROFILE=1: start-up steps on stderr.
from tally.model_file import NoSuchClass, load_model_class

_MAX_ERROR = 2000
_MAX_CLASSES = 4096


class _Connection:
    def __init__(self, fd):
        os.set_inheritable(fd, False)
        self.sock = socket.socket(fileno=fd)
        self.buf = bytearray()
        self.fds = collections.deque()
        self.lock = threading.Lock()

    def _recv(self):
        data, anc, _, _ = self.sock.recvmsg(1 << 20, socket.CMSG_SPACE(64 * 4))
        for level, kind, cdata in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(cdata[: len(cdata) - len(cdata) % fds.itemsize])
                self.fds.extend(fds)
        if not data:
            raise EOFError
        self.buf += data

    def read(self):
        while len(self.buf) < 4:
            self._recv()
        (n,) = struct.unpack("<I", self.buf[:4])
        while len(self.buf) < 4 + n:
            self._recv()
        msg = json.loads(bytes(self.buf[4 : 4 + n]))
        del self.buf[: 4 + n]
        return msg

    def write(self, obj):
        data = json.dumps(obj).encode()
        with self.lock:
            self.sock.sendall(struct.pack("<I", len(data)) + data)


def _watch_parent(ppid):
    # The stub dies with its worker, even while predict() is stuck.
    while True:
        time.sleep(0.5)
        if os.getppid() != ppid:
            os._exit(1)


def _short(text):
    text = text.strip()
    return text if len(text) <= _MAX_ERROR else "..." + text[-_MAX_ERROR:]


def _torch():
    return sys.modules.get("torch")


def _is_tensor(x):
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


_GPU_STATS = {"at": 0.0, "fresh": 0, "stats": []}


def _gpu_stats(devices, cached=False):
    """The devices' memory figures. cached=True (a steady batch's answer) reuses the last figures for
    up to a second once a few batches have been answered fresh: torch's memory_stats builds a dict of
    every allocator counter under the GIL, which the launching thread of a small model misses."""
    now = time.monotonic()
    if cached and _GPU_STATS["fresh"] >= 4 and now - _GPU_STATS["at"] < 1.0:
        return _GPU_STATS["stats"]
    stats = _gpu_stats_now(devices)
    _GPU_STATS.update(at=now, fresh=_GPU_STATS["fresh"] + 1, stats=stats)
    return stats


def _gpu_stats_now(devices):
    torch = _torch()
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return []
    out = []
    for d in devices:
        if not d.startswith("cuda"):
            continue
        idx = int(d.split(":")[1]) if ":" in d else 0
        free, total = _mem_get_info(torch, idx)
        out.append(
            {
                "device": d,
                "name": torch.cuda.get_device_name(idx),
                "peak_memory_bytes": int(torch.cuda.max_memory_reserved(idx)),
                "memory_used_bytes": int(total - free),
                "memory_total_bytes": int(total),
            }
        )
    return out


_MEM_INFO = {}  # device index -> (monotonic time, (free, total))


def _mem_get_info(torch, idx):
    """The device's free and total memory, asked of the driver at most once a second."""
    now = time.monotonic()
    cached = _MEM_INFO.get(idx)
    if cached is None or now - cached[0] > 1.0:
        cached = (now, torch.cuda.mem_get_info(idx))
        _MEM_INFO[idx] = cached
    return cached[1]


def _contract(shape, dtype, h, w):
    return (
        "the model's output has shape %s and dtype %s; expected the mask's size %dx%d: HxW integer class "
        "labels, CxHxW float scores (C >= 2), or HxW / 1xHxW float single score" % (tuple(shape), dtype, h, w)
    )


def _first_position(flat_index, w):
    return "(y=%d, x=%d)" % (flat_index // w, flat_index % w)


def _label_range_error(lo, hi, first_index, w):
    """The row's error when label-map values fall outside 0..65534, else None; first_index(bad)
    gives the flat index of the first value for which bad(values) holds."""
    if lo < 0:
        pos = first_index(lambda v: v < 0)
        return "the model's output has label %d at %s; labels must be >= 0" % (lo, _first_position(pos, w))
    if hi > 65534:
        pos = first_index(lambda v: v > 65534)
        return "the model's output has label %d at %s; labels must be <= 65534" % (hi, _first_position(pos, w))
    return None


def _numpy(x):
    return x.detach().cpu().numpy() if _is_tensor(x) else np.asarray(x)


def _instances(out, h, w):
    """A detection dict (torchvision's convention: masks N x H x W bool/uint8 or N x 1 x H x W
    probabilities, scores N, labels N category ids) as uncompressed COCO RLEs (column-major runs)."""
    missing = [k for k in ("masks", "scores", "labels") if k not in out]
    if missing:
        return {"error": "the model's output dict has no %s; an instance output has masks, scores and labels"
                % ", ".join(repr(k) for k in missing)}
    masks = out["masks"]
    if _is_tensor(masks):
        if masks.is_floating_point():
            masks = masks > 0.5  # Probabilities, thresholded on the model's device.
        masks = masks.detach().cpu().numpy()
    else:
        masks = np.asarray(masks)
        if masks.dtype.kind == "f":
            masks = masks > 0.5
    scores = _numpy(out["scores"]).astype(np.float64).reshape(-1)
    labels = _numpy(out["labels"]).reshape(-1)
    if masks.ndim == 4 and masks.shape[1] == 1:
        masks = masks[:, 0]
    if masks.ndim != 3 or masks.shape[1:] != (h, w):
        return {"error": "the model's masks have shape %s; expected N x %d x %d (or N x 1 x %d x %d)"
                % (tuple(masks.shape), h, w, h, w)}
    n = masks.shape[0]
    if len(scores) != n or len(labels) != n:
        return {"error": "the model returned %d masks, %d scores and %d labels; expected as many of each"
                % (n, len(scores), len(labels))}
    if n and not np.all(np.isfinite(scores)):
        return {"error": "the model's scores hold NaN or infinity (detection %d)" % int(np.flatnonzero(~np.isfinite(scores))[0])}
    if labels.dtype.kind not in "iub":
        return {"error": "the model's labels have dtype %s; expected integer category ids" % labels.dtype}
    instances = []
    for k in range(n):
        flat = np.ascontiguousarray(masks[k].T).reshape(-1) != 0  # Column by column, as COCO's RLE.
        change = np.flatnonzero(flat[1:] != flat[:-1]) + 1
        runs = np.diff(np.concatenate(([0], change, [flat.size])))
        if flat.size and flat[0]:
            runs = np.concatenate(([0], runs))
        instances.append({"counts": runs.tolist(), "score": float(scores[k]), "label": int(labels[k])})
    return {"kind": "instances", "instances": instances}


def _convert(out, h, w, mm, offset):
    """Writes one output into the output buffer at `offset`; returns its StubOutput."""
    if isinstance(out, dict):
        return _instances(out, h, w)
    if _is_tensor(out):
        torch = _torch()
        t = out.detach()
        shape, dtype = tuple(t.shape), str(t.dtype).replace("torch.", "")
        if t.is_complex():
            return {"error": _contract(shape, dtype, h, w)}
        floating = t.is_floating_point()
    else:
        if not isinstance(out, np.ndarray):
            try:
                out = np.asarray(out)
            except Exception:
                return {"error": "the model's output is a %s; expected a numpy array or a torch tensor" % type(out).__name__}
        a = out
        shape, dtype = a.shape, str(a.dtype)
        if a.dtype.kind not in "fiub":
            return {"error": _contract(shape, dtype, h, w)}
        floating = a.dtype.kind == "f"
    single = shape == (h, w) or shape == (1, h, w)
    if floating and len(shape) == 3 and shape[0] >= 2 and shape[1:] == (h, w):
        c = shape[0]
        if c > _MAX_CLASSES:
            return {"error": "the model returned %d score channels; at most %d classes" % (c, _MAX_CLASSES)}
        if _is_tensor(out):
            nonfinite = int((~torch.isfinite(t)).sum().item())
            dest = np.ndarray((h, w), np.int16, buffer=mm, offset=offset)
            torch.from_numpy(dest).copy_(t.argmax(0).to(torch.int16))
        else:
            nonfinite = int(np.count_nonzero(~np.isfinite(a)))
            dest = np.ndarray((h, w), np.uint16, buffer=mm, offset=offset)
            dest[...] = np.argmax(a, axis=0)
        return {"kind": "argmax", "channels": c, "nonfinite": nonfinite}
    if floating and single:
        dest = np.ndarray((h, w), np.float32, buffer=mm, offset=offset)
        if _is_tensor(out):
            torch.from_numpy(dest).copy_(t.reshape(h, w))
        else:
            np.copyto(dest, a.reshape(h, w), casting="unsafe")
        return {"kind": "score"}
    if not floating and single:
        if _is_tensor(out):
            lab = t.reshape(h, w)
            if lab.dtype == torch.bool:
                lab = lab.to(torch.uint8)
            lo, hi = int(lab.min().item()), int(lab.max().item())
            error = _label_range_error(lo, hi, lambda bad: int(bad(lab.reshape(-1)).nonzero()[0].item()), w)
            if error:
                return {"error": error}
            if hi <= 32767:
                dest = np.ndarray((h, w), np.int16, buffer=mm, offset=offset)
                torch.from_numpy(dest).copy_(lab.to(torch.int16))
                return {"kind": "labels"}
            a = lab.cpu().numpy()
        else:
            a = a.reshape(h, w)
            if a.size:
                error = _label_range_error(int(a.min()), int(a.max()), lambda bad: int(np.flatnonzero(bad(a.reshape(-1)))[0]), w)
                if error:
                    return {"error": error}
        dest = np.ndarray((h, w), np.uint16, buffer=mm, offset=offset)
        dest[...] = a.reshape(h, w)
        return {"kind": "labels"}
    return {"error": _contract(shape, dtype, h, w)}


def _convert_volume(out, d, h, w, mm, offset):
    """One volume's output: D x H x W (or 1 x D x H x W) integer labels, or C x D x H x W float scores
    (C >= 2, argmax here on the model's device), written as uint16 labels at `offset`."""
    contract = ("the model's output has shape %s and dtype %s; expected the reference's size %dx%dx%d (D x H x W): "
                "D x H x W integer class labels or C x D x H x W float scores (C >= 2)")
    tensor = _is_tensor(out)
    if tensor:
        t = out.detach()
        shape, dtype, floating = tuple(t.shape), str(t.dtype).replace("torch.", ""), t.is_floating_point()
    else:
        t = np.asarray(out)
        shape, dtype, floating = t.shape, str(t.dtype), t.dtype.kind == "f"
        if t.dtype.kind not in "fiub":
            return {"error": contract % (shape, dtype, d, h, w)}
    dest = np.ndarray((d, h, w), np.uint16, buffer=mm, offset=offset)
    if floating and len(shape) == 4 and shape[0] >= 2 and shape[1:] == (d, h, w):
        if shape[0] > _MAX_CLASSES:
            return {"error": "the model returned %d score channels; at most %d classes" % (shape[0], _MAX_CLASSES)}
        if tensor:
            torch = _torch()
            nonfinite = int((~torch.isfinite(t)).sum().item())
            dest[...] = t.argmax(0).to(torch.int32).cpu().numpy()
        else:
            nonfinite = int(np.count_nonzero(~np.isfinite(t)))
            dest[...] = np.argmax(t, axis=0)
        return {"kind": "argmax", "channels": int(shape[0]), "nonfinite": nonfinite}
    if not floating and shape in ((d, h, w), (1, d, h, w)):
        a = (t.to(_torch().int64).cpu().numpy() if tensor else t.astype(np.int64)).reshape(d, h, w)
        if a.size:
            error = _label_range_error(int(a.min()), int(a.max()), lambda bad: int(np.flatnonzero(bad(a.reshape(-1)))[0]), w)
            if error:
                return {"error": error}
        dest[...] = a
        return {"kind": "labels"}
    return {"error": contract % (shape, dtype, d, h, w)}


def _cuda_ready():
    torch = _torch()
    return torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()


class _Stub:
    def __init__(self, conn):
        self.conn = conn
        self.buffers = {}
        self.registered = {}  # buffer id -> address registered with CUDA (page-locked)
        self.model = None
        self.devices = []
        # Predict answers waiting for their GPU copies: the answer thread sends each once its copies
        # have landed, while this thread already launches the next batch (see serve()).
        self.answers = queue.Queue()
        self.times = collections.Counter()  # TALLY_STUB_PROFILE
        self.download_streams = {}  # device index -> the side stream outputs come back on
        self.compile_state = None  # --compile (tally.compile_trial)
        self.request_id = 0  # The predict being served.
        self.deferred = collections.deque()  # Requests read while waiting for a compile_decision.
        threading.Thread(target=self._answer_loop, daemon=True).start()

    def _answer_loop(self):
        while True:
            answer = self.answers.get()
            try:
                t0 = time.perf_counter()
                reply = answer()  # Waits on a CUDA event (the GIL is released meanwhile).
                self.times["wait for GPU (answer thread)"] += time.perf_counter() - t0
                self.conn.write(reply)
            except (EOFError, ConnectionError, OSError):
                os._exit(0)  # The worker went away.
            finally:
                self.answers.task_done()

    def _register(self):
        # Page-lock the shared buffers once the model has initialised CUDA: host<->device copies
        # from and to them are then direct and, with non_blocking=True, asynchronous.
        if not _cuda_ready() or not any(d.startswith("cuda") for d in self.devices):
            return
        cudart = _torch().cuda.cudart()
        for bid, mm in self.buffers.items():
            if bid in self.registered:
                continue
            addr = np.frombuffer(mm, np.uint8).__array_interface__["data"][0]
            err = cudart.cudaHostRegister(addr, len(mm), 0)
            self.registered[bid] = addr if int(err) == 0 else None
            if int(err) != 0:
                print("cudaHostRegister of a %d-byte buffer failed (%s): copies will be synchronous" % (len(mm), err), flush=True)

    def _unregister(self, bid):
        addr = self.registered.pop(bid, None)
        if addr is not None and _cuda_ready():
            _torch().cuda.cudart().cudaHostUnregister(addr)

    def init(self, msg):
        _phase("init")
        path = msg.get("model_path", "")
        class_name = msg.get("class_name") or "Model"
        self.devices = list(msg.get("devices", [])) or ["cpu"]
        options = dict(msg.get("options", {}))
        try:
            cls = load_model_class(path, class_name)
        except NoSuchClass as e:
            return {"op": "error", "error": str(e)}
        except BaseException:
            return {"op": "error", "error": _short(traceback.format_exc())}
        try:
            self.model = cls(list(self.devices), options)
        except BaseException:
            return {"op": "error", "error": _short(traceback.format_exc())}
        num_classes = getattr(self.model, "num_classes", 0) or 0
        try:
            num_classes = int(num_classes)
        except (TypeError, ValueError):
            return {"op": "error", "error": "%s.num_classes is %r; expected an integer" % (class_name, num_classes)}
        if num_classes == 1 or num_classes < 0 or num_classes > _MAX_CLASSES:
            return {"op": "error", "error": "%s.num_classes is %d; expected 2..%d" % (class_name, num_classes, _MAX_CLASSES)}
        _phase("model built")
        compiled = []
        if msg.get("compile"):
            from tally.compile_trial import make_switches

            error, compiled, self.compile_state = make_switches(self.model, class_name, self._on_compile_trial)
            if error:
                return {"op": "error", "error": error}
        else:
            from tally.cuda_graphs import wrap_modules

            wrap_modules(self.model)  # Eager models replay their forward passes from CUDA graphs.
        return {
            "op": "ready",
            "compiled": compiled,
            "num_classes": num_classes,
            "outputs_probabilities": bool(getattr(self.model, "outputs_probabilities", False)),
            "gpus": _gpu_stats(self.devices),
        }

    def _on_compile_trial(self, trial):
        """--compile's trial ran (inside the model's first call): tells the worker and waits for the
        job's choice, keeping the requests that arrive meanwhile for serve()."""
        self.conn.write({"op": "compile_trial", "id": self.request_id, "trial": trial})
        while True:
            msg = self.conn.read()
            if msg.get("op") == "compile_decision":
                return bool(msg.get("compiled"))
            self.deferred.append(msg)

    def predict(self, msg):
        if not self.times:
            _phase("first predict request")
        self.request_id = msg.get("id", 0)
        self._register()
        items = msg.get("items", [])
        images_mm = self.buffers[int(msg["image_buffer"])]
        out_mm = self.buffers[int(msg["output_buffer"])]
        raw_mm = self.buffers.get(int(msg.get("raw_buffer", 0))) if msg.get("raw_buffer") else None
        images, rows = [], []
        for it in items:
            h, w = int(it["height"]), int(it["width"])
            # Views of the shared buffer, valid until predict returns: copy what must outlive it.
            if it.get("dtype") and raw_mm is not None:
                # 16-bit TIFF and DICOM: the stored values with their dtype (H x W, or H x W x C).
                c = int(it.get("channels", 1))
                images.append(np.ndarray((h, w) if c == 1 else (h, w, c), np.dtype(it["dtype"]), buffer=raw_mm,
                                         offset=int(it.get("raw_offset", 0))))
            else:
                images.append(np.ndarray((h, w, 3), np.uint8, buffer=images_mm, offset=int(it.get("image_offset", 0))))
            row = dict(it.get("row", {}))
            row["index"] = int(it.get("index", 0))
            rows.append(row)
        torch = _torch()
        grad = torch.no_grad() if torch is not None else contextlib.nullcontext()
        try:
            with grad:
                t0 = time.perf_counter()
                outs = self.model.predict(images, rows)
                self.times["predict()"] += time.perf_counter() - t0
                if outs is None:
                    raise TypeError("predict returned None; it must return one output per image")
                t0 = time.perf_counter()
                batched = self._convert_batch(outs, items, out_mm)
                self.times["convert outputs"] += time.perf_counter() - t0
                if batched is not None:
                    rid = msg.get("id", 0)

                    def answer():
                        try:
                            return {"op": "result", "id": rid, "outputs": batched(), "gpus": _gpu_stats(self.devices, cached=True)}
                        except Exception as e:  # A CUDA error surfacing at the synchronisation.
                            return {"op": "result", "id": rid, "error": _short("%s: %s" % (type(e).__name__, e))}

                    return answer
                outs = list(outs)
                if len(outs) != len(items):
                    raise ValueError("predict returned %d outputs for %d images; it must return one per image" % (len(outs), len(items)))
                outputs = []
                for it, out in zip(items, outs):
                    outputs.append(_convert(out, int(it["height"]), int(it["width"]), out_mm, int(it.get("output_offset", 0))))
        except Exception as e:
            name = type(e).__name__
            text = "%s: %s" % (name, e)
            oom = "OutOfMemoryError" in name or "out of memory" in str(e).lower()
            if oom and torch is not None and torch.cuda.is_available():
                torch.cuda.empty_cache()
            return {"op": "result", "id": msg.get("id", 0), "error": _short(text), "oom": oom}
        return {"op": "result", "id": msg.get("id", 0), "outputs": outputs, "gpus": _gpu_stats(self.devices)}

    def predict_volume(self, msg):
        """One volume: C x D x H x W voxels (z, y, x), the row with its spacing (z, y, x) and affine."""
        self.request_id = msg.get("id", 0)
        self._register()
        it = msg.get("items", [{}])[0]
        c, d, h, w = int(it.get("channels", 1)), int(it["depth"]), int(it["height"]), int(it["width"])
        mm = self.buffers[int(msg["image_buffer"])]
        out_mm = self.buffers[int(msg["output_buffer"])]
        image = np.ndarray((c, d, h, w), np.dtype(it.get("dtype") or "float32"), buffer=mm,
                           offset=int(it.get("image_offset", 0)))
        row = dict(it.get("row", {}))
        row["index"] = int(it.get("index", 0))
        row["spacing"] = tuple(float(v) for v in it.get("spacing", []))
        row["affine"] = np.asarray([float(v) for v in it.get("affine", [])], np.float64).reshape(4, 4)
        torch = _torch()
        grad = torch.no_grad() if torch is not None else contextlib.nullcontext()
        try:
            with grad:
                outs = self.model.predict([image], [row])
                if outs is None:
                    raise TypeError("predict returned None; it must return one output per volume")
                outs = list(outs)
                if len(outs) != 1:
                    raise ValueError("predict returned %d outputs for 1 volume; it must return one per volume" % len(outs))
                output = _convert_volume(outs[0], d, h, w, out_mm, int(it.get("output_offset", 0)))
        except Exception as e:
            name = type(e).__name__
            oom = "OutOfMemoryError" in name or "out of memory" in str(e).lower()
            if oom and torch is not None and torch.cuda.is_available():
                torch.cuda.empty_cache()
            return {"op": "result", "id": msg.get("id", 0), "error": _short("%s: %s" % (name, e)), "oom": oom}
        return {"op": "result", "id": msg.get("id", 0), "outputs": [output], "gpus": _gpu_stats(self.devices)}

    def _download_stream(self, torch, device):
        stream = self.download_streams.get(device.index)
        if stream is None:
            stream = self.download_streams[device.index] = torch.cuda.Stream(device=device)
        return stream

    def _convert_batch(self, outs, items, out_mm):
        """One N x C x H x W float tensor for a batch of one size: argmax and non-finite counts in one
        pass on the model's device. None when the output is anything else (converted per image)."""
        if not _is_tensor(outs) or outs.dim() != 4 or not outs.is_floating_point() or not items:
            return None
        n, c, h, w = outs.shape
        if n != len(items) or c < 2 or c > _MAX_CLASSES:
            return None
        if any((int(it["height"]), int(it["width"])) != (h, w) for it in items):
            return None
        torch = _torch()
        t = outs.detach()
        nonfinite = (~torch.isfinite(t)).sum(dim=(1, 2, 3))
        labels = t.argmax(1).to(torch.int16)
        if t.is_cuda:
            # Asynchronous, on a side stream: the copies go straight into the page-locked output
            # buffer while the model's stream goes on with the next batch; the answer waits for an
            # event, so the stub can start the next batch first (serve()).
            current = torch.cuda.current_stream(t.device)
            side = self._download_stream(torch, t.device)
            side.wait_stream(current)
            counts = torch.empty(n, dtype=torch.int64, pin_memory=True)
            with torch.cuda.stream(side):
                counts.copy_(nonfinite, non_blocking=True)
                offsets = [int(it.get("output_offset", 0)) for it in items]
                if all(o == offsets[0] + i * h * w * 2 for i, o in enumerate(offsets)):
                    # Back to back in the buffer (a batch of one size): one copy.
                    dest = np.ndarray((n, h, w), np.int16, buffer=out_mm, offset=offsets[0])
                    torch.from_numpy(dest).copy_(labels, non_blocking=True)
                else:
                    for i, o in enumerate(offsets):
                        dest = np.ndarray((h, w), np.int16, buffer=out_mm, offset=o)
                        torch.from_numpy(dest).copy_(labels[i], non_blocking=True)
                done = torch.cuda.Event()
                done.record(side)
            labels.record_stream(side)
            nonfinite.record_stream(side)
        else:
            counts = nonfinite
            for i, it in enumerate(items):
                dest = np.ndarray((h, w), np.int16, buffer=out_mm, offset=int(it.get("output_offset", 0)))
                torch.from_numpy(dest).copy_(labels[i])
            done = None

        def finish():
            if done is not None:
                t0 = time.perf_counter()
                done.synchronize()
                self.times["wait for GPU"] += time.perf_counter() - t0
            return [{"kind": "argmax", "channels": int(c), "nonfinite": int(v)} for v in counts.tolist()]

        return finish

    def serve(self):
        # TALLY_STUB_PROFILE=1: every 25 predict requests, where the stub's time went (reading
        # requests, inside the model's predict(), waiting for the GPU), to the worker's log.
        profile = os.environ.get("TALLY_STUB_PROFILE") == "1"
        times = self.times
        requests = 0
        recorded = False  # The installed modules this model needed were kept (after its first batch).
        while True:
            try:
                t_read = time.perf_counter()
                msg = self.deferred.popleft() if self.deferred else self.conn.read()
                times["read request"] += time.perf_counter() - t_read
                if msg.get("op") == "predict":
                    requests += 1
                    if requests == 1:
                        cpu0, wall0 = time.thread_time(), time.perf_counter()
                    if profile and requests % 25 == 0:
                        registered = sum(v is not None for v in self.registered.values())
                        busy = (time.thread_time() - cpu0) / max(1e-9, time.perf_counter() - wall0)
                        print("stub profile over %d requests (%d registered buffers; this thread on a CPU %.0f %% of "
                              "the time since the first): %s" % (requests, registered, 100 * busy, ", ".join(
                                  "%s %.2f ms/request" % (k, 1000 * v / requests) for k, v in sorted(times.items()))),
                              flush=True)
                else:
                    # Buffers may be unmapped, the model replaced or the stub stopped: let every
                    # answer in flight land first.
                    self.answers.join()
            except (EOFError, ConnectionError, OSError):
                return
            op = msg.get("op")
            if op == "map":
                fd = self.conn.fds.popleft()
                try:
                    self.buffers[int(msg["buffer"])] = mmap.mmap(fd, int(msg["size"]))
                finally:
                    os.close(fd)
            elif op == "unmap":
                # Views handed to the model may still refer to it: let the garbage collector unmap.
                self._unregister(int(msg.get("buffer", 0)))
                self.buffers.pop(int(msg.get("buffer", 0)), None)
            elif op == "init":
                _GPU_STATS["fresh"] = 0
                reply = self.init(msg)
                reply["id"] = msg.get("id", 0)
                self.conn.write(reply)
            elif op == "predict":
                reply = self.predict(msg)
                if not recorded:  # What the first batch imported, for the next spare process.
                    recorded = _record_imports()
                if callable(reply):
                    # Outputs still on their way from the GPU: the answer thread sends them, and this
                    # thread reads and launches the next batch meanwhile, so the GPU never waits for it.
                    self.answers.put(reply)
                else:
                    self.answers.join()  # Answers leave in request order.
                    self.conn.write(reply)
            elif op == "predict_volume":
                self.answers.join()  # Answers leave in request order.
                reply = self.predict_volume(msg)
                if not recorded:
                    recorded = _record_imports()
                self.conn.write(reply)
            elif op == "compile_decision":
                # The job's choice, for a model whose trial ran in an earlier job (a reused runner).
                if self.compile_state is not None:
                    self.compile_state.mode = "compiled" if msg.get("compiled") else "eager"
            elif op == "empty_cache":
                torch = _torch()
                if torch is not None and torch.cuda.is_available():
                    torch.cuda.empty_cache()
            elif op == "reset_peak":
                # tally estimate: the next batches' peak alone (after the answers in flight left).
                self.answers.join()
                _GPU_STATS["fresh"] = 0
                torch = _torch()
                if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.empty_cache()
                    for d in self.devices:
                        if d.startswith("cuda"):
                            torch.cuda.reset_peak_memory_stats(int(d.split(":")[1]) if ":" in d else 0)
            elif op == "exit":
                return


def _record_imports():
    """Keeps the installed modules this model process needed, for the next spare one (tally/spare.py).
    Returns True."""
    folder = os.environ.get("TALLY_PRELOAD_DIR", "")
    if folder:
        try:
            from tally.spare import record

            record(folder)
        except Exception as e:  # Only the next job's start is at stake.
            print("the list of imported modules was not kept: %s: %s" % (type(e).__name__, e), flush=True)
    return True


def main():
    _phase("started")
    fd = int(os.environ.get("TALLY_STUB_FD", "-1"))
    if fd < 0:
        sys.stderr.write("tally.stub is started by tally-worker (TALLY_STUB_FD is not set)\n")
        return 2
    spare = os.environ.pop("TALLY_STUB_SPARE", "") == "1"  # Started before its job (tally/spare.py).
    # Before torch is imported: its bytecode kept in Tally's cache where it has none (tally/bytecode.py).
    note = keep_bytecode(os.environ.get("TALLY_BYTECODE_DIR", ""))
    if note:
        print(note, flush=True)
    # Interrupts are for the worker, which stops this process itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    if spare:
        from tally import spare as spare_process

        count, seconds, interrupted, files = spare_process.prepare(os.environ.get("TALLY_PRELOAD_DIR", ""), fd)
        print("model process prepared for the next job: %d modules imported in %.1f s%s"
              % (count, seconds, " (its job came first: the rest as it needs them)" if interrupted else ""), flush=True)
        spare_process.wait_for_job(fd, files)  # Or a fresh interpreter in its place.
        print("prepared model process taken by a job (%d modules imported ahead)" % count, flush=True)
        _phase("adopted")
    _Stub(_Connection(fd)).serve()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (CUDA contexts, model threads): the worker waits for the exit.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
