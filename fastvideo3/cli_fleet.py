"""Fleet-side commands of the ``fastvideo3`` CLI.

    fastvideo3 serve [--card wan-tiny] [--port P] [--replicas denoiser=2] [--transport auto|cuda_ipc|shm|grpc|nixl]
                     [--schedulers N] [--no-reward] [--no-batching] [--fake] [--device D] [--precision P]
                     [--log-dir DIR]
                     [--state-store redis://host:port/db] [--gateway-port P [--media-dir DIR] [--api-keys-file F]]
    fastvideo3 client generate --target HOST:PORT "PROMPT" -o out.mp4 [generate's options] [--rewards a,b]
    fastvideo3 client describe --target HOST:PORT
    fastvideo3 client cancel --target HOST:PORT REQUEST_ID
    fastvideo3 deployment-card ... | slo report ...      (cli_deploy.py, cli_slo.py)

They are registered here so the core CLI stays small; each imports its implementation lazily
(``serve`` lives in ``fleet/launcher.py``, the client in :mod:`fastvideo3.client`).
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path

from fastvideo3.errors import InvalidRequest
from fastvideo3.vocab import EventKind, OutputFormat, Role


def _replicas(text: str) -> tuple[str, int]:
    role, sep, n = text.partition("=")
    if not sep or not n.isdigit() or int(n) < 1:
        raise argparse.ArgumentTypeError(f"expected ROLE=N with N >= 1, e.g. denoiser=2 (got {text!r})")
    return role, int(n)


def add_commands(sub) -> None:
    """Register fleet commands on the CLI's subparsers."""
    from fastvideo3.cli_args import CARD_HELP, _float, _Parser, _size

    s = sub.add_parser("serve", help="start a local fleet (one process per role pool + the scheduler)")
    s.add_argument("--card", default="wan-tiny", help=CARD_HELP)
    s.add_argument("--port", type=int, default=None, help="the scheduler's port (default: a free port)")
    s.add_argument("--replicas", type=_replicas, action="append", default=[], help="ROLE=N, e.g. denoiser=2")
    s.add_argument("--transport", default="auto", choices=("auto", "cuda_ipc", "shm", "grpc", "nixl"),
                   help="tensor transport between pools (auto: cuda_ipc between GPU pools, else shm on one "
                        "host, nixl across hosts, grpc)")
    s.add_argument("--no-reward", action="store_true", help="do not start a reward pool")
    s.add_argument("--expert-pools", action="store_true",
                   help="two-expert cards: one denoiser pool set per expert (the latent moves at the switch)")
    s.add_argument("--schedulers", type=int, default=1,
                   help="scheduler replicas (> 1 elects a leader; needs --state-store redis://...)")
    s.add_argument("--no-batching", action="store_true", help="scheduler sends one WorkUnit per pool call")
    s.add_argument("--max-running", type=int, default=None, help="requests stepping at once")
    s.add_argument("--fake", action="store_true", help="no-op pools (no model math): for overhead tests")
    s.add_argument("--device", default=None)
    s.add_argument("--precision", default=None)
    s.add_argument("--log-dir", default=None, help="where each process writes its log (default: a temp dir)")
    s.add_argument("--start-timeout", type=float, default=300.0)
    s.add_argument("--state-store", default=None,
                   help="memory:// (default) or redis://host:port/db, for the scheduler and the gateway")
    s.add_argument("--gateway-port", type=int, default=None,
                   help="also serve the OpenAI Videos API and the playground on this port")
    s.add_argument("--gateway-host", default="127.0.0.1")
    s.add_argument("--media-dir", default=None, help="where the gateway keeps videos (default: under --log-dir)")
    s.add_argument("--api-keys-file", default=None, help="bearer keys the gateway accepts (default: no auth)")

    c = sub.add_parser("client", help="talk to a running fleet")
    csub = c.add_subparsers(dest="client_cmd", required=True, parser_class=_Parser)
    g = csub.add_parser("generate", help="generate a video on a running fleet")
    g.add_argument("--target", required=True, help="the scheduler's HOST:PORT")
    g.add_argument("prompt")
    g.add_argument("-o", "--output", required=True, help="out.mp4 (H.264) or out.npy (float32 frames)")
    g.add_argument("--model", default="", help="card id (default: the fleet's)")
    g.add_argument("--steps", type=int, default=None)
    g.add_argument("--frames", type=int, default=None)
    g.add_argument("--size", type=_size, default=None, help="WIDTHxHEIGHT")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--guidance", type=_float, default=None)
    g.add_argument("--guidance-2", type=_float, default=None, dest="guidance_2",
                   help="two-expert cards: the low-noise expert's guidance (guidance_scale_2)")
    g.add_argument("--negative-prompt", default=None)
    g.add_argument("--sampler", default=None)
    g.add_argument("--flow-shift", type=_float, default=None)
    g.add_argument("--cfg-policy", default=None)
    g.add_argument("--image", default=None, metavar="PATH_OR_URL",
                   help="image-to-video cards: the first frame (a PNG/JPEG/WebP file, or an http(s) URL the "
                        "scheduler fetches when it allows URLs)")
    g.add_argument("--rewards", default="", help="comma list of reward scorers to run on the result")
    g.add_argument("--timeout", type=float, default=3600.0, help="seconds for the whole request")
    g.add_argument("--quiet", action="store_true", help="no progress bar")
    d = csub.add_parser("describe", help="print the fleet's DeploymentCard and counters (JSON)")
    d.add_argument("--target", required=True)
    k = csub.add_parser("cancel", help="cancel a request")
    k.add_argument("--target", required=True)
    k.add_argument("request_id")

    from fastvideo3 import cli_deploy, cli_slo
    cli_deploy.add_commands(sub)
    cli_slo.add_commands(sub)


def run(args) -> int:
    if args.cmd == "serve":
        return cmd_serve(args)
    if args.cmd == "client":
        return cmd_client(args)
    if args.cmd == "deployment-card":
        from fastvideo3 import cli_deploy
        return cli_deploy.run(args)
    if args.cmd == "slo":
        from fastvideo3 import cli_slo
        return cli_slo.run(args)
    raise SystemExit(f"unknown command {args.cmd}")


# ----------------------------------------------------------------------------------- serve
def cmd_serve(args) -> int:
    from fleet.launcher import FleetError, LocalFleet

    roles = (Role.ENCODER, Role.DENOISER, Role.DECODER) + (() if args.no_reward else (Role.REWARD,))
    replicas = dict(args.replicas)
    bad = set(replicas) - set(roles)
    if bad:
        raise InvalidRequest(f"unknown role {sorted(bad)[0]!r}", field="replicas", limit=", ".join(roles))
    sched_args = (["--no-batching"] if args.no_batching else []) + (
        ["--max-running", str(args.max_running)] if args.max_running else []) + (
        ["--state-store", args.state_store] if args.state_store else [])
    if args.gateway_port is not None and not 0 < args.gateway_port < 65536:
        raise InvalidRequest(f"{args.gateway_port} is out of range", field="gateway_port", limit="[1, 65535]")
    experts: tuple[str, ...] = ()
    if args.expert_pools:
        from fastvideo3.card import resolve_card
        experts = tuple(resolve_card(args.card).dit_components())
        if len(experts) < 2:
            raise InvalidRequest(f"card {args.card} has one denoising expert", field="expert_pools",
                                 limit="a two-expert card")
    if not 1 <= args.schedulers <= 16:
        raise InvalidRequest(f"{args.schedulers} is out of range", field="schedulers", limit="[1, 16]")
    if args.schedulers > 1 and not (args.state_store or "").startswith(("redis://", "rediss://", "unix://")):
        raise InvalidRequest("scheduler replicas elect a leader through a shared store", field="schedulers",
                             limit="1 without --state-store redis://...")
    fleet = LocalFleet(args.card, replicas=replicas, roles=roles, port=args.port, transport=args.transport,
                       device=args.device, precision=args.precision, fake=args.fake, scheduler_args=sched_args,
                       log_dir=args.log_dir, denoiser_experts=experts, schedulers=args.schedulers)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"starting a {args.card} fleet (logs: {fleet.log_dir}) ...", flush=True)
    t0 = time.perf_counter()
    try:
        fleet.start(timeout_s=args.start_timeout)
    except FleetError as e:
        print(f"fastvideo3: error: {e}", file=sys.stderr)
        return 1
    print(f"fleet serving after {time.perf_counter() - t0:.1f}s", flush=True)
    for i, sched in enumerate(fleet.schedulers):
        print(f"  scheduler  {sched.target}" + ("" if len(fleet.schedulers) == 1 else
                                                 " (leader)" if i == 0 else " (standby)"), flush=True)
    for role, procs in fleet.pools.items():
        print(f"  {role:<10} {', '.join(p.target for p in procs)}", flush=True)
    gateway = None
    if args.gateway_port is not None:
        gateway = _start_gateway(args, fleet)
        if gateway is None:
            fleet.stop()
            return 1
    print(f"try: fastvideo3 client generate --target {fleet.target} \"a red circle\" -o out.mp4", flush=True)
    print("Ctrl-C stops the fleet", flush=True)
    code = 0
    while not stop.wait(0.5):
        if gateway is not None and not gateway.alive():  # stateless: bring it back on its port
            print(f"fastvideo3: gateway exited ({gateway.proc.returncode}); restarting it", file=sys.stderr, flush=True)
            try:
                gateway.restart(timeout_s=args.start_timeout)
                print(f"  gateway    {gateway.url} (pid {gateway.proc.pid})", flush=True)
            except Exception as e:  # noqa: BLE001 - report and stop the fleet
                print(f"fastvideo3: error: {e}", file=sys.stderr)
                code = 1
                break
        dead = fleet.dead()
        if dead:
            print(f"fastvideo3: error: {dead[0].name} exited ({dead[0].proc.returncode}):\n{dead[0].log_tail()}",
                  file=sys.stderr)
            code = 1
            break
    print("stopping the fleet ...", flush=True)
    if gateway is not None:
        gateway.stop()
    codes = fleet.stop()
    print("stopped: " + ", ".join(f"{k}={v}" for k, v in codes.items()), flush=True)
    return code


def _start_gateway(args, fleet):
    """The OpenAI Videos API gateway next to the fleet (fleet/gateway), or None if it failed."""
    from fleet.gateway.process import GatewayError, GatewayProcess

    gw_args = ["--media-dir", args.media_dir or str(Path(fleet.log_dir) / "media")]
    if args.state_store:
        gw_args += ["--state-store", args.state_store]
    if args.api_keys_file:
        gw_args += ["--api-keys-file", args.api_keys_file]
    gateway = GatewayProcess(fleet.target, args.gateway_port, host=args.gateway_host, args=gw_args,
                             log_dir=fleet.log_dir)
    try:
        gateway.start(timeout_s=args.start_timeout)
    except GatewayError as e:
        print(f"fastvideo3: error: {e}", file=sys.stderr)
        gateway.stop()
        return None
    print(f"  gateway    {gateway.url} (pid {gateway.proc.pid}; OpenAI Videos API at {gateway.url}/v1, "
          f"playground at {gateway.url}/)", flush=True)
    return gateway


# ----------------------------------------------------------------------------------- client
def cmd_client(args) -> int:
    from fastvideo3.client import FleetClient

    with FleetClient(args.target, timeout_s=getattr(args, "timeout", 3600.0)) as client:
        if args.client_cmd == "describe":
            print(json.dumps(client.describe(), indent=2, default=str))
            return 0
        if args.client_cmd == "cancel":
            ok = client.cancel(args.request_id, reason="cli")
            print(f"{args.request_id}: {'cancelled' if ok else 'already finished'}")
            return 0
        return _client_generate(client, args)


def _client_generate(client, args) -> int:
    out = Path(args.output)
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in (OutputFormat.MP4, OutputFormat.NPY):
        raise InvalidRequest(f"unsupported output {args.output!r}", field="output", limit=".mp4 or .npy")
    width, height = args.size if args.size else (None, None)
    rewards = [r.strip() for r in args.rewards.split(",") if r.strip()]
    bar = None
    if not args.quiet:
        from tqdm import tqdm
        bar = tqdm(total=0, desc="queued", unit="step", file=sys.stderr, leave=False)

    def on_event(ev):
        if bar is None:
            return
        if ev.kind == EventKind.PROGRESS:
            bar.set_description(ev.data["phase"])
            if ev.data["phase"] == "denoise":
                bar.total = ev.data["total"]
                bar.n = ev.data["step"]
            bar.refresh()

    t0 = time.perf_counter()
    try:
        video = client.generate(args.prompt, model=args.model, negative_prompt=args.negative_prompt,
                                num_frames=args.frames, height=height, width=width, num_inference_steps=args.steps,
                                guidance_scale=args.guidance, guidance_scale_2=args.guidance_2, seed=args.seed,
                                flow_shift=args.flow_shift,
                                sampler=args.sampler, cfg_policy=args.cfg_policy, output_format=fmt, rewards=rewards,
                                on_event=on_event, **_image_arg(args.image))
    finally:
        if bar is not None:
            bar.close()
    written = video.save(out)
    print(f"wrote {written[0]} ({len(video.data)} bytes, {time.perf_counter() - t0:.1f}s, request {video.request_id})")
    print(f"provenance: {written[1]}")
    if video.rewards:
        print("rewards: " + ", ".join(f"{k}={v:.4f}" for k, v in sorted(video.rewards.items())))
    return 0


def _image_arg(value: str | None) -> dict:
    """``--image``: a file's bytes, or a URL passed on for the scheduler to fetch."""
    if value is None:
        return {}
    if value.startswith(("http://", "https://")):
        return {"image": value}
    try:
        return {"image": Path(value).read_bytes()}
    except OSError as e:
        raise InvalidRequest(f"cannot read {value}: {e.strerror}", field="image") from None
