"""A Python client for a running fleet (the scheduler service's ``Scheduler`` gRPC contract).

    from fastvideo3.client import FleetClient
    with FleetClient("127.0.0.1:50051") as client:
        video = client.generate("a red circle moving left", num_frames=17, seed=0)
        video.save("out.mp4")                   # + out.mp4.json (provenance sidecar)
        for ev in client.stream("a cat", output_format="npy"):
            print(ev.kind, ev.data)

Parameter names follow diffusers (and :meth:`fastvideo3.Engine.generate`). Failures raise the
core's typed errors (:mod:`fastvideo3.errors`), rebuilt from the gRPC status and the
``fv3-error-bin`` trailer. Closing a :meth:`FleetClient.stream` iterator early cancels the
request server-side (the scheduler sees the disconnect).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc

from fastvideo3.errors import FastVideoError, Internal, InvalidRequest, from_code
from fastvideo3.rpc import (  # noqa: F401  (error_from_rpc, make_channel, plain and the rest are part of this API)
    AUTH_HEADER, ERROR_TRAILER, TokenInterceptor, error_from_rpc, make_channel, plain,
)
from fastvideo3.vocab import EventKind, OutputFormat, RunStatus

MAX_MESSAGE_BYTES = 64 << 20
_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
STATES = ("UNSPECIFIED", "QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")


def stream_broken(err: FastVideoError, request_id: str | None) -> FastVideoError:
    """A Generate stream that broke after its request was accepted: the scheduler replica went
    away, not the request (a request that fails ends its stream with an ``error`` event). Sending
    the same request again (same id, same parameters) re-attaches to it on any replica."""
    from fastvideo3.errors import Unavailable, loss_report
    how = f"send the same request again (id {request_id!r}, same parameters) to re-attach to it"
    return Unavailable(f"the stream to the scheduler broke before the request ended ({err.message}); {how}",
                       retry_after_s=1.0, request_id=request_id,
                       details={"cause": err.message, **loss_report(retryable=True, role="scheduler")})


def error_data(e) -> dict[str, Any]:
    """A wire ``Error`` as plain data: code, message, field, limit, step, retry hint, and the loss
    report — ``retryable`` (None: not said), ``resume_from_step`` and ``loss`` (role, replica,
    step_reached, checkpoint; None when no replica was lost)."""
    from fastvideo3.v1 import common_pb2
    loss = ({"role": e.loss.role, "replica": e.loss.replica, "step_reached": e.loss.step_reached,
             "checkpoint": e.loss.checkpoint} if e.HasField("loss") else None)
    return {"code": common_pb2.Error.Code.Name(e.code), "message": e.message, "field": e.field or None,
            "limit": e.limit or None, "step": e.step if e.HasField("step") else None,
            "retry_after_s": e.retry_after_s if e.HasField("retry_after_s") else None,
            "retryable": e.retryable if e.HasField("retryable") else None,
            "resume_from_step": e.resume_from_step if e.HasField("resume_from_step") else None,
            "loss": loss, "details": dict(e.details)}


def loss_details(d: dict[str, Any]) -> dict[str, Any]:
    """:func:`error_data`'s loss report back as typed-error ``details`` (fastvideo3.errors.LOSS_KEYS)."""
    out = dict(d.get("details") or {})
    for key in ("retryable", "resume_from_step"):
        if d.get(key) is not None:
            out[key] = d[key]
    loss = d.get("loss") or {}
    if loss:
        out.update(lost_role=loss["role"], lost_replica=loss["replica"], step_reached=loss["step_reached"],
                   checkpoint=loss["checkpoint"])
    return out


@dataclass
class FleetEvent:
    """One event of a request's stream. ``kind``: accepted, queued, progress, preview, artifact,
    error, finished; ``data`` holds the event's fields as plain Python values."""

    kind: str
    request_id: str
    seq: int
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class FleetVideo:
    """A finished request's artifact: the encoded file's bytes plus its provenance sidecar."""

    request_id: str
    name: str
    mime_type: str
    data: bytes
    sidecar: dict[str, Any]
    rewards: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def format(self) -> str:
        return Path(self.name).suffix.lstrip(".")

    @property
    def frames(self):
        """Decoded frames (float32 [F, H, W, 3]) of an ``npy`` artifact."""
        import numpy as np
        if self.format != OutputFormat.NPY:
            raise FastVideoError(f"frames are only decodable from npy output, not {self.format}",
                                 field="output_format", limit=OutputFormat.NPY)
        return np.load(io.BytesIO(self.data), allow_pickle=False)

    def save(self, path: str | os.PathLike[str]) -> list[Path]:
        """Write the file (atomically) and ``<path>.json``; the suffix must match the format."""
        dest = Path(path)
        if dest.suffix.lstrip(".").lower() != self.format:
            raise FastVideoError(f"output {dest.name!r} does not match the artifact format {self.format!r}",
                                 field="output", limit=f".{self.format}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        written = []
        for target, blob in ((dest, self.data),
                             (dest.with_name(dest.name + ".json"),
                              (json.dumps(self.sidecar, indent=2, sort_keys=True) + "\n").encode())):
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(blob)
                os.chmod(tmp, 0o644)
                os.replace(tmp, target)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            written.append(target)
        return written


def _event(msg) -> FleetEvent:
    kind = msg.WhichOneof("event")
    body = getattr(msg, kind)
    if kind == EventKind.ACCEPTED:
        data = {"card_id": body.card_id, "program": body.program, "seed": body.seed,
                "num_inference_steps": body.num_inference_steps,
                "resolved": json.loads(body.resolved_params_json or b"{}")}
    elif kind == EventKind.QUEUED:
        data = {"position": body.position, "estimated_wait_s": body.estimated_wait_s}
    elif kind == EventKind.PROGRESS:
        data = {"phase": body.phase, "step": body.step, "total": body.total, "elapsed_s": body.elapsed_s,
                "metrics": dict(body.metrics)}
    elif kind == EventKind.ARTIFACT:
        data = {"name": body.name, "mime_type": body.mime_type, "chunk_index": body.chunk_index, "last": body.last,
                "data": bytes(body.data), "total_bytes": body.total_bytes, "checksum": body.checksum,
                "sidecar": json.loads(body.sidecar_json) if body.sidecar_json else None}
    elif kind == EventKind.ERROR:
        data = error_data(body.error)
    elif kind == EventKind.FINISHED:
        data = {"state": STATES[body.state], "timings": dict(body.timings), "rewards": dict(body.rewards),
                "gpu_seconds": body.gpu_seconds}
    else:
        data = {"step": getattr(body, "step", 0)}
    return FleetEvent(kind, msg.request_id, msg.seq, data)


class FleetClient:
    def __init__(self, target: str, *, timeout_s: float = 3600.0, rpc_timeout_s: float = 10.0,
                 root_certificates: bytes | None = None, private_key: bytes | None = None,
                 certificate_chain: bytes | None = None, token: str | None = None):
        """``root_certificates`` (PEM) turns TLS on (plus a client certificate for mutual TLS);
        ``token`` is sent as a bearer token. Both off by default (a plaintext loopback fleet)."""
        from fastvideo3.v1 import scheduler_pb2_grpc
        self.target = target
        self.timeout_s = timeout_s  # whole-stream deadline of a Generate call
        self.rpc_timeout_s = rpc_timeout_s  # deadline of the unary RPCs
        self.channel = make_channel(target, _OPTIONS, root_certificates=root_certificates, private_key=private_key,
                                    certificate_chain=certificate_chain, token=token)
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)

    # -- requests ---------------------------------------------------------------------------
    def request(self, prompt: str, *, negative_prompt: str | None = None, num_frames: int | None = None,
                height: int | None = None, width: int | None = None, num_inference_steps: int | None = None,
                guidance_scale: float | None = None, seed: int | None = None, flow_shift: float | None = None,
                sampler: str | None = None, cfg_policy: str | None = None, output_format: str = OutputFormat.MP4,
                guidance_scale_2: float | None = None,
                rewards: list[str] | tuple[str, ...] = (), request_id: str | None = None, model: str = "",
                deadline_s: float | None = None, fps: int | None = None, slo_class: str = "",
                metadata: dict[str, str] | None = None, detached: bool = False, adapters: list | None = None,
                cache: dict | None = None, image: bytes | str | None = None):
        """The wire GenerateRequest for these (diffusers-named) parameters. ``detached``: the
        request outlives this client's stream and can be re-attached by id (job-style APIs).
        ``cache``: an interceptor, ``{"policy": name, param: number-or-bool, ...}`` (docs/extend.md).
        ``image``: an image-to-video card's first frame: its bytes (or base64 text, a data URL), or
        an http(s) URL the scheduler fetches when it allows URLs."""
        from fastvideo3.v1 import scheduler_pb2
        msg = scheduler_pb2.GenerateRequest(prompt=prompt, request_id=request_id or "", model=model,
                                            output_format=output_format, slo_class=slo_class,
                                            reward_scorers=list(rewards), metadata=dict(metadata or {}),
                                            detached=detached)
        for a in adapters or []:  # [{"id": ..., "scale": ...}]: LoRA adapters loaded in the fleet
            msg.adapters.add(id=a["id"], scale=float(a.get("scale", 1.0)))
        for name, value in (("negative_prompt", negative_prompt), ("num_frames", num_frames), ("height", height),
                            ("width", width), ("num_inference_steps", num_inference_steps),
                            ("guidance_scale", guidance_scale), ("guidance_scale_2", guidance_scale_2), ("seed", seed),
                            ("flow_shift", flow_shift),
                            ("sampler", sampler), ("cfg_policy", cfg_policy), ("deadline_s", deadline_s),
                            ("fps", fps)):
            if value is not None:
                setattr(msg, name, value)
        if isinstance(image, (bytes, bytearray, memoryview)):
            msg.image = bytes(image)
        elif isinstance(image, str) and image.strip().startswith(("http://", "https://")):
            msg.image_url = image.strip()
        elif isinstance(image, str):  # base64 text or a data URL
            from fastvideo3.request.image import image_bytes
            msg.image = image_bytes(image)
        elif image is not None:
            raise InvalidRequest(f"must be bytes or a URL, got {type(image).__name__}", field="image")
        if cache is not None:
            msg.cache.policy = str(cache.get("policy", ""))
            for k, v in cache.items():
                if k == "policy":
                    continue
                if isinstance(v, bool):
                    msg.cache.flags[k] = v
                else:
                    msg.cache.params[k] = float(v)
        return msg

    def stream(self, prompt: str, *, timeout_s: float | None = None, **kw) -> Iterator[FleetEvent]:
        """Submit a request and yield its events until ``finished``. Closing the iterator early
        (or dropping it) cancels the call, and with it the request."""
        call = self.stub.Generate(self.request(prompt, **kw), timeout=timeout_s or self.timeout_s)
        accepted = False
        rid = kw.get("request_id")
        try:
            for msg in call:
                ev = _event(msg)
                accepted = accepted or ev.kind == EventKind.ACCEPTED
                rid = rid or ev.request_id
                yield ev
        except grpc.RpcError as err:
            e = error_from_rpc(err)
            if accepted and e.code == "UNAVAILABLE" and "retryable" not in e.details:
                raise stream_broken(e, rid) from None
            raise e from None
        finally:
            call.cancel()  # no-op after a complete stream

    def generate(self, prompt: str, *, on_event: Callable[[FleetEvent], None] | None = None, **kw) -> FleetVideo:
        """Run a request to completion and return its artifact; raises the typed error on failure."""
        chunks: list[bytes] = []
        meta: dict[str, Any] = {}
        error: FleetEvent | None = None
        finished: FleetEvent | None = None
        for ev in self.stream(prompt, **kw):
            if on_event is not None:
                on_event(ev)
            if ev.kind == EventKind.ARTIFACT:
                if ev.data["chunk_index"] == 0:
                    chunks, meta = [], dict(ev.data)
                chunks.append(ev.data["data"])
                if ev.data["last"]:
                    meta["checksum"] = ev.data["checksum"]
            elif ev.kind == EventKind.ERROR:
                error = ev
            elif ev.kind == EventKind.FINISHED:
                finished = ev
        if finished is None or finished.data["state"] != RunStatus.SUCCEEDED:
            if error is not None:
                d = error.data
                raise from_code(d["code"], d["message"], field=d["field"], limit=d["limit"], step=d["step"],
                                request_id=error.request_id, retry_after_s=d.get("retry_after_s"),
                                details=loss_details(d))
            raise Internal("the stream ended without a result")
        data = b"".join(chunks)
        want = meta.get("checksum", "")
        if want and want != "sha256:" + hashlib.sha256(data).hexdigest():
            from fastvideo3.errors import DataLoss
            raise DataLoss("artifact checksum mismatch", field="artifact")
        return FleetVideo(request_id=finished.request_id, name=meta.get("name", "video"),
                          mime_type=meta.get("mime_type", ""), data=data, sidecar=meta.get("sidecar") or {},
                          rewards=dict(finished.data["rewards"]), timings=dict(finished.data["timings"]))

    def cancel(self, request_id: str, reason: str = "") -> bool:
        from fastvideo3.v1 import scheduler_pb2
        try:
            resp = self.stub.Cancel(scheduler_pb2.CancelRequest(request_id=request_id, reason=reason),
                                    timeout=self.rpc_timeout_s)
        except grpc.RpcError as err:
            raise error_from_rpc(err) from None
        return resp.cancelled

    def get(self, request_id: str) -> dict[str, Any]:
        """Where a request stands: state, phase, step/total, error."""
        from fastvideo3.v1 import scheduler_pb2
        try:
            s = self.stub.GetRequest(scheduler_pb2.GetRequestRequest(request_id=request_id), timeout=self.rpc_timeout_s)
        except grpc.RpcError as err:
            raise error_from_rpc(err) from None
        err = error_data(s.error) if s.HasField("error") else None
        return {"request_id": s.request_id, "state": STATES[s.state], "card_id": s.card_id, "phase": s.phase,
                "step": s.step, "total": s.total, "last_seq": s.last_seq, "error": err}

    def load_adapter(self, adapter_id: str, path: str, timeout_s: float = 300.0) -> dict[str, Any]:
        """Admin: load a LoRA file (readable by the pools) into every denoiser replica."""
        from fastvideo3.v1 import adapter_pb2
        try:
            r = self.stub.LoadAdapter(adapter_pb2.LoadAdapterRequest(adapter_id=adapter_id, path=str(path)),
                                      timeout=timeout_s)
        except grpc.RpcError as err:
            raise error_from_rpc(err) from None
        return {"id": r.adapter_id, "version": r.version, "rank": r.rank, "bytes": r.bytes,
                "replicas": list(r.replicas)}

    def unload_adapter(self, adapter_id: str, wait_s: float = 0.0) -> list[str]:
        """Admin: refuse new requests naming the adapter, remove it once its requests are done."""
        from fastvideo3.v1 import adapter_pb2
        try:
            r = self.stub.UnloadAdapter(adapter_pb2.UnloadAdapterRequest(adapter_id=adapter_id, wait_s=wait_s),
                                        timeout=self.rpc_timeout_s + wait_s)
        except grpc.RpcError as err:
            raise error_from_rpc(err) from None
        return list(r.versions)

    def describe(self) -> dict[str, Any]:
        """The fleet's DeploymentCard and live counters, as plain data."""
        from google.protobuf.json_format import MessageToDict

        from fastvideo3.v1 import scheduler_pb2
        try:
            d = self.stub.Describe(scheduler_pb2.DescribeSchedulerRequest(), timeout=self.rpc_timeout_s)
        except grpc.RpcError as err:
            raise error_from_rpc(err) from None
        out = MessageToDict(d, preserving_proto_field_name=True)
        out.pop("diagnostics_json", None)
        out["description"] = description_dict(d)
        return out

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "FleetClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def description_dict(d) -> dict[str, Any]:
    """A ``SchedulerDescription`` as plain data for people and scripts: its typed live facts
    (edges, batching, adapters, load, one entry per pool replica keyed by replica id) over the
    scheduler's diagnostics (configuration, counters by section, admission, scaling)."""
    out: dict[str, Any] = json.loads(d.diagnostics_json or "{}")
    pools: dict[str, Any] = {}
    for p in d.pools:
        entry = plain(p.description) if p.HasField("description") else {"role": p.role}
        entry.update({"target": p.address, "remote_counters": dict(p.remote_counters),
                      "health_changed_unix": p.health_changed_unix, "output_transport": p.output_transport})
        if p.error:
            entry["error"] = p.error
        pools[p.replica_id] = entry
    out.update({"transport_edges": dict(d.transport_edges), "batching": d.batching,
                "batch_invariant_bucket": d.batch_invariant_bucket or None, "adapters": dict(d.adapters),
                "load": plain(d.load), "pools": pools})
    return out

