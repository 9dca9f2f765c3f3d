"""Tally's Python client: submit jobs to a tallyd, wait for them, read their reports.

    from tally.client import Client

    client = Client("tally.lab:50051", token=open("alice.token").read().strip(), tls_ca="ca.pem")
    jobs = [client.submit(model="/models/unet.pt", manifest=f"/data/shard{i}.csv", labels={"sweep": "a"})
            for i in range(4)]
    client.wait(jobs)
    for job in client.jobs(label={"sweep": "a"}):
        report = client.report(job["job_id"])          # report.json, parsed
        print(job["job_id"], report["foreground_dice_mean"])
    rows = client.per_image(jobs[0])                    # a pandas DataFrame (ids as str), else dicts

Needs grpcio and protobuf (Debian: python3-grpcio, python3-protobuf); pandas is optional. The gRPC
modules (tally_pb2, tally_pb2_grpc) are generated from proto/tally.proto by the build into
BUILD/python: put that folder on PYTHONPATH next to this package's (docs/operations.md "Python client").
"""

import csv
import io
import json
import os
import sys
import time

import grpc

try:
    import tally_pb2
    import tally_pb2_grpc
except ImportError:  # A checkout with a build/ folder: use the modules the build generated.
    _generated = os.environ.get("TALLY_PROTO_DIR") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "python")
    sys.path.insert(0, _generated)
    try:
        import tally_pb2
        import tally_pb2_grpc
    except ImportError as e:
        raise ImportError("tally.client needs tally_pb2 and tally_pb2_grpc, which the build generates into "
                          "BUILD/python: put that folder on PYTHONPATH (or set TALLY_PROTO_DIR)") from e

from google.protobuf import json_format

__all__ = ["Client", "TallyError", "JobFailed"]

_STATES = {v: k[len("JOB_STATE_"):].lower() for k, v in tally_pb2.JobState.items()}
_TERMINAL = {"succeeded", "failed", "cancelled"}
# Codes of a tallyd that is restarting or not yet up: waits ride them (Client.wait).
_RESTARTING = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}


class TallyError(Exception):
    """A call tallyd refused or could not answer; `code` is the grpc.StatusCode."""

    def __init__(self, code, message):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class JobFailed(TallyError):
    pass


def _job_dict(job):
    """A Job as a dict: every field of proto/tally.proto's Job under its own name (`spec` holds the
    submitted settings), plus, at the top level for convenience, `name` and `labels` (copies of
    spec.name and spec.labels), `priority`, and `state` as a word ("queued", "running", "succeeded",
    "failed", "cancelled"). Scheduling while it runs: `workers_assigned`, `running_share`,
    `queue_position` (0: not waiting), `waiting` (why, in words; "" when it is not)."""
    d = json_format.MessageToDict(job, preserving_proto_field_name=True)
    d["state"] = _STATES.get(job.state, "unknown")
    d["name"] = job.spec.name
    d["labels"] = dict(job.spec.labels)
    d["priority"] = job.spec.priority
    d["workers_assigned"] = job.workers_assigned
    d["running_share"] = job.running_share
    d["queue_position"] = job.queue_position
    d["waiting"] = job.waiting
    for k in ("images_total", "images_evaluated", "images_failed", "images_held", "images_planned"):
        d[k] = int(d.get(k, 0))
    # Live estimates (docs/metrics.md "Answers before the end"): per class, the running mean Dice and IoU
    # over the committed rows with their 95% intervals and half-widths.
    # The intervals are betting intervals (docs/metrics.md "Intervals"); NaN where there is none (too few
    # rows, or a manifest-order job's rows, which are no random sample: `live_note` says which).
    # Protobuf's JSON leaves out fields that are 0 and writes NaN as "NaN".
    d["live"] = [dict(e, rows=int(e.get("rows", 0)), class_id=int(e.get("class_id", 0)),
                      **{k: float(e.get(k, 0)) for k in ("dice_mean", "dice_half_width", "dice_ci_low", "dice_ci_high",
                                                          "iou_mean", "iou_half_width", "iou_ci_low", "iou_ci_high")},
                      foreground=bool(e.get("foreground", False))) for e in d.get("live", [])]
    return d


# JobSpec fields tallyd fills in (hashes, resolved trials, warnings): never a client's to give.
_SERVER_SET = {"model_sha256", "manifest_sha256", "coco_sha256", "coco_results_sha256", "model_option_sha256",
               "channels_last_resolved", "channels_last_trial", "decode_resolved", "decode_trial",
               "manifest_warnings", "run_warnings", "duplicate_id_rows", "batch_alignment", "coco_categories",
               "volume_inputs", "manifest_columns", "max_json_file_bytes", "tar_starts", "tar_compressed"}
# The CLI's flag names that are no JobSpec field, as `tally submit` reads them.
_CLI_NAMES = {"order", "sample", "images", "masks", "label", "model_option", "window", "image_ext", "mask_ext",
              "prediction_ext"}


def _cli_options(options, spec):
    """The CLI's flag names turned into JobSpec fields (client/job_flags.cc does the same)."""
    out = dict(options)
    if "order" in out:
        order = str(out.pop("order")).lower()
        if order == "random" or order.startswith("random:"):
            out["random_order"] = True
            if ":" in order:
                out["order_seed"] = int(order.split(":", 1)[1])
        elif order != "manifest":
            raise ValueError(f"order: expected manifest or random[:SEED], got {order!r}")
    if "sample" in out:
        sample = str(out.pop("sample"))
        if sample.endswith("%"):
            out["sample_percent"] = float(sample[:-1])
        else:
            out["sample_rows"] = int(sample)
    if ("sample_rows" in out or "sample_percent" in out or out.get("until_ci")) and "random_order" not in out:
        out["random_order"] = True  # As the CLI: a sample is drawn in a random order.
    if "masks" in out:  # --images DIR --masks DIR: two folders (docs/data.md "Where your data can be").
        out["masks_dir"] = out.pop("masks")
        if "images" in out:
            out["images_dir"] = out.pop("images")
    if "images" in out:
        out["coco_images"] = out.pop("images")
    if "shards" in out:  # --shards PATTERN (or a list of patterns)
        shards = out["shards"]
        out["shards"] = [os.path.abspath(x) for x in ([shards] if isinstance(shards, str) else shards)]
    for flag, field in (("image_ext", "image_extensions"), ("mask_ext", "mask_extensions"),
                        ("prediction_ext", "prediction_extensions")):
        if flag in out:
            value = out.pop(flag)
            out[field] = [e.strip().lstrip(".") for e in (value.split(",") if isinstance(value, str) else value)
                          if e.strip()]
    if "label" in out:
        k, v = str(out.pop("label")).split("=", 1)
        out.setdefault("labels", {})[k] = v
    if "window" in out:  # --window CENTRE,WIDTH
        center, width = (float(x) for x in str(out.pop("window")).split(","))
        out["window_center"], out["window_width"] = center, width
    if "model_option" in out:
        k, v = str(out.pop("model_option")).split("=", 1)
        out.setdefault("model_options", {})[k] = v
    return out


# JobSpec fields that name files or folders: made absolute before they are sent.
_PATH_OPTIONS = {"save_predictions", "coco", "coco_images", "coco_results", "coco_panoptic", "panoptic_dir",
                 "panoptic_predictions", "panoptic_predictions_dir", "images_dir", "masks_dir"}


def _absolute_model(model):
    """PATH or PATH.py:Class with PATH made absolute, as the CLI sends it."""
    path, sep, cls = model.rpartition(":")
    if sep and path.endswith(".py") and cls.isidentifier():
        return os.path.abspath(path) + ":" + cls
    return os.path.abspath(model)


class Client:
    """A connection to one tallyd. Thread-safe as gRPC channels are."""

    def __init__(self, address="127.0.0.1:50051", token=None, tls_ca=None, tls_cert=None, tls_key=None,
                 timeout=60.0):
        if token is None:
            token = os.environ.get("TALLY_TOKEN") or None
        if token is not None:
            # A token read from the file `tally token` wrote ends in a newline: whitespace is no part of
            # a token. What remains must be a valid header value; the error never shows the token.
            token = token.strip()
            if not token or any(ord(c) < 0x21 or ord(c) > 0x7e for c in token):
                raise ValueError("the token is empty or holds characters no token has (it is not shown here); "
                                 "pass the contents of the file `tally token --out FILE` wrote")
        if tls_ca:
            def read(p):
                with open(p, "rb") as f:
                    return f.read()
            creds = grpc.ssl_channel_credentials(read(tls_ca), read(tls_key) if tls_key else None,
                                                 read(tls_cert) if tls_cert else None)
            self._channel = grpc.secure_channel(address, creds)
        else:
            self._channel = grpc.insecure_channel(address)
        self._stub = tally_pb2_grpc.CoordinatorStub(self._channel)
        self._metadata = [("authorization", f"Bearer {token}")] if token else []
        self._timeout = timeout
        self.address = address

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request, timeout=None):
        try:
            return getattr(self._stub, method)(request, metadata=self._metadata, timeout=timeout or self._timeout)
        except grpc.RpcError as e:
            raise TallyError(e.code(), e.details()) from None

    # Jobs -----------------------------------------------------------------------------------

    def submit(self, manifest=None, model=None, **options):
        """Submits a job; returns its id. `options` are the CLI's job flags by name (dashes or
        underscores): name, labels={...} (or label="k=v"), metrics=[...] or "dice,iou", batch_size,
        shard_size, mean, std, num_classes, thresholds, iou_thresholds, empty_score,
        max_failed_fraction, python, model_options={...}, ignore_index, label_map={...}, precision,
        thumbnails, save_predictions, order="random" | "random:SEED" | "manifest", sample=60 or
        "30%", until_ci=0.04, min_rows, images= (--images of COCO jobs; with masks=, two folders),
        shards="data/train-{000..099}.tar" (tar shards; image_ext=, mask_ext=), ... and any other JobSpec
        field (proto/tally.proto) a client sets. Paths are made absolute here, as tallyd and the
        workers read them. COCO jobs (docs/instances.md "Instances"): manifest=None with coco=...,
        images=... and coco_results=... (or a model); or coco_panoptic=..., panoptic_dir=...,
        panoptic_predictions=...."""
        spec = tally_pb2.JobSpec(manifest=os.path.abspath(manifest) if manifest else "")
        if model:
            spec.model = _absolute_model(model)
        fields = spec.DESCRIPTOR.fields_by_name
        options = _cli_options({k.replace("-", "_"): v for k, v in options.items()}, spec)
        for key, value in options.items():
            if key not in fields or key in _SERVER_SET:
                why = "set by tallyd" if key in _SERVER_SET else "not a job option"
                names = sorted(set(fields) - _SERVER_SET | set(_CLI_NAMES))
                raise TypeError(f"submit() got {key!r}: {why}; the options are: {', '.join(names)}")
            field = fields[key]
            if key in _PATH_OPTIONS and value:
                value = os.path.abspath(value)
            if key == "metrics" and isinstance(value, str):
                value = [m for m in value.split(",") if m]
            if field.message_type is not None and field.message_type.GetOptions().map_entry:
                getattr(spec, key).update({k: v for k, v in value.items()})
            elif field.label == field.LABEL_REPEATED:
                getattr(spec, key).extend(value)
            else:
                setattr(spec, key, value)
        return self._call("SubmitJob", tally_pb2.SubmitJobRequest(spec=spec), timeout=600).job.job_id

    def _resolve(self, job_id):
        """A job id, or a prefix of one as the CLI takes it (`tally status j2026`): the one job this
        token sees whose id starts with it; ambiguous or unknown: TallyError NOT_FOUND."""
        try:
            return self._call("GetJob", tally_pb2.GetJobRequest(job_id=job_id)).job_id
        except TallyError as e:
            if e.code != grpc.StatusCode.NOT_FOUND or not job_id:
                raise
        matches = [j["job_id"] for j in self.jobs() if j["job_id"].startswith(job_id)]
        if len(matches) == 1:
            return matches[0]
        why = f"is ambiguous: {', '.join(matches[:10])}" if matches else "matches no job"
        raise TallyError(grpc.StatusCode.NOT_FOUND, f"job id prefix {job_id!r} {why}")

    def job(self, job_id):
        """The job as a dict (Job's fields; `state` as "queued", "running", "succeeded", ...). `job_id`
        may be a prefix, as on the command line."""
        return _job_dict(self._call("GetJob", tally_pb2.GetJobRequest(job_id=self._resolve(job_id))))

    def jobs(self, label=None, state=None):
        """Every job this token may see, newest first, optionally only those with all of `label`'s
        key/values and in `state`."""
        request = tally_pb2.ListJobsRequest(limit=1000)
        if label:
            request.labels.update(label)
        if state:
            request.state = getattr(tally_pb2, "JOB_STATE_" + state.upper())
        out = []
        while True:
            page = self._call("ListJobs", request)
            out.extend(_job_dict(j) for j in page.jobs)
            if not page.next_page_token:
                return out
            request.page_token = page.next_page_token

    def cancel(self, job_id):
        return _job_dict(self._call("CancelJob", tally_pb2.CancelJobRequest(job_id=self._resolve(job_id))))

    def _patiently(self, call, deadline, what):
        """call() until it answers: tallyd restarting (UNAVAILABLE, or CANCELLED as it stops) is ridden
        through until `deadline` (time.monotonic(); None: 120 s of not answering), then TimeoutError."""
        backoff = 0.25
        give_up = deadline if deadline is not None else time.monotonic() + 120
        while True:
            try:
                return call()
            except TallyError as e:
                if e.code not in _RESTARTING:
                    raise
                if time.monotonic() + backoff > give_up:
                    raise TimeoutError(f"{what}: tallyd at {self.address} has not answered ({e.message})") from None
                time.sleep(backoff)
                backoff = min(2.0, backoff * 2)

    def wait(self, job_ids, timeout=None, poll=0.25, raise_on_failure=False):
        """Blocks until every job has ended and its report is ready. Returns the jobs (a dict for
        one id, a list for several). TimeoutError after `timeout` seconds (the jobs go on); with
        `raise_on_failure`, JobFailed for a job that failed or was cancelled. A tallyd restart (or a
        tallyd not yet up) is ridden through until the timeout (without one: 120 s of silence)."""
        single = isinstance(job_ids, str)
        deadline = None if timeout is None else time.monotonic() + timeout
        ids = [self._patiently(lambda i=i: self._resolve(i), deadline, "wait")
               for i in ([job_ids] if single else list(job_ids))]
        done = {}
        while len(done) < len(ids):
            for i in ids:
                if i in done:
                    continue
                j = self._patiently(lambda i=i: self.job(i), deadline, "wait")
                if j["state"] in _TERMINAL and j.get("report_ready"):
                    if raise_on_failure and j["state"] != "succeeded":
                        raise JobFailed(grpc.StatusCode.ABORTED, f"job {i} {j['state']}: {j.get('error', '')}")
                    done[i] = j
            if len(done) < len(ids):
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"jobs still running after {timeout} s: {[i for i in ids if i not in done]}")
                time.sleep(poll)
        return done[ids[0]] if single else [done[i] for i in ids]

    def watch(self, job_id, timeout=None, poll=0.5):
        """Yields the job (a dict, as job() gives it) each time its progress or state changes, until
        it has ended and its report is ready (the last one yielded). Rides a tallyd restart as wait()
        does; TimeoutError after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        job_id = self._patiently(lambda: self._resolve(job_id), deadline, "watch")
        last = None
        while True:
            j = self._patiently(lambda: self.job(job_id), deadline, "watch")
            key = (j["state"], j["images_evaluated"], j["images_failed"], j.get("report_ready"), j["waiting"])
            if key != last:
                last = key
                yield j
            if j["state"] in _TERMINAL and j.get("report_ready"):
                return
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still running after {timeout} s")
            time.sleep(poll)

    # Reports --------------------------------------------------------------------------------

    def report_files(self, job_id, partial=False):
        """The job's report files as {name: bytes}; `partial`: a running job's, over the rows so far."""
        request = tally_pb2.FetchReportRequest(job_id=self._resolve(job_id), partial=partial)
        files = {}
        try:
            for chunk in self._stub.FetchReport(request, metadata=self._metadata, timeout=600):
                files[chunk.file_name] = files.get(chunk.file_name, b"") + chunk.data
        except grpc.RpcError as e:
            raise TallyError(e.code(), e.details()) from None
        return files

    def fetch(self, job_id, out_dir):
        """Writes the report files into `out_dir`; returns their paths."""
        os.makedirs(out_dir, exist_ok=True)
        paths = []
        for name, data in self.report_files(job_id).items():
            path = os.path.join(out_dir, os.path.basename(name))
            with open(path, "wb") as f:
                f.write(data)
            paths.append(path)
        return paths

    def report(self, job_id, partial=False):
        """report.json, parsed (infinity as float('inf') whichever --json-infinity the job used);
        `partial`: a running job's report over the rows committed so far."""
        text = self.report_files(job_id, partial)["report.json"].decode("utf-8")
        return json.loads(text, parse_constant=float,
                          object_hook=lambda o: {k: (float(v) if v in ("inf", "-inf") else v) for k, v in o.items()})

    def per_image(self, job_id):
        """per_image.csv as a pandas DataFrame when pandas is installed (ids, images and masks kept as
        strings: "000123" stays "000123"), else a list of dicts of strings."""
        data = self.report_files(job_id)["per_image.csv"].decode("utf-8")
        try:
            import pandas as pd
        except ImportError:
            return list(csv.DictReader(io.StringIO(data)))
        text = ("id", "image", "mask", "prediction", "class", "region", "category",
                "image_xxh128", "mask_xxh128", "prediction_xxh128")
        frame = pd.read_csv(io.StringIO(data), dtype=str, keep_default_na=False)
        integers = ("index", "tp", "fp", "fn", "tn", "nonfinite")
        for column in frame.columns:
            if column in integers:
                frame[column] = frame[column].astype("int64")
            elif column not in text:
                # Exactly the written values (pandas' own float parser is not round-trip).
                frame[column] = frame[column].replace({"": "nan"}).astype(float)
        return frame
