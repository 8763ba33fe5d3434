"""Run what the Helm chart renders as local processes: the container command, args and env of
every fleet Deployment, with the cluster mapped onto this machine.

    plan = LocalPlan(objects, workdir, secrets={("fastvideo3-redis", "url"): redis_url},
                     services={"fv-fastvideo3-redis": redis_url}, card_map={"wan2.1-t2v-1.3b": "wan-tiny"})
    with RenderedFleet(plan) as fleet: FleetClient(fleet.target).generate(...)

The mapping, and nothing else, is what differs from a pod:
- one pod per Deployment, one process per container (replicas are a scheduling matter) — but
  the scheduler's Deployment runs one pod per replica (they elect a leader: that is behaviour,
  not scheduling), each with ports of its own; its Service maps to the first;
  `python` is this interpreter;
- every container port gets a free loopback port (below 32768: Dynamo reads its system port as
  an i16), used where the container names that port (flags, env values); Service DNS names
  (short or FQDN) with a Service port become 127.0.0.1:<the port of the selected container>;
- a listen address 0.0.0.0 and $(POD_IP) become 127.0.0.1 (and $(POD_IP):<container port> the
  pod's local port); `--metrics-port` gets a free port;
- cards are mapped (a GPU card to the tiny card) in args and in the mounted config files;
- volumes: the ConfigMap is written to a directory; a model volume (claim, hostPath, emptyDir)
  is a directory; a claim or hostPath is filled with the tiny card's weights (the test plays
  the volume's content), an emptyDir is filled by running the rendered init container, whose
  URL is mapped to a local archive of those weights;
- env: values as rendered with $(VAR) expansion, fieldRef status.podIP, secretKeyRef from `secrets`;
- fleet services get --exit-with-parent; every process runs in its own session and is stopped
  (SIGTERM, then SIGKILL of its group) by the fleet.
Deployments whose containers run other than `python -m services.*`, `fleet.dynamo` or
`dynamo.frontend` must be given in `replaced` (e.g. the bundled Redis, played by the test's
redis-server) or the plan refuses them.
"""
from __future__ import annotations

import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet.launcher import REPO_ROOT, FleetProcess, LocalFleet

WEIGHTS_DIR = REPO_ROOT / "fastvideo3" / "weights"
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
MODULES = ("services.", "fleet.dynamo", "fleet.gateway", "dynamo.frontend")
_taken: set[int] = set()


def free_port() -> int:
    """A free loopback port below 32768, not handed out before by this process."""
    for _ in range(500):
        port = random.randrange(20000, 32768)
        if port in _taken:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _taken.add(port)
        return port
    raise AssertionError("no free port below 32768")


@dataclass
class ProcSpec:
    name: str  # the Deployment's component (plus "-<container>" for a pod's further containers)
    role: str  # scheduler | encoder | ... for fleet services; the module otherwise
    port: int | None  # the gRPC port of a fleet service
    argv: list[str]
    env: dict[str, str]
    init: list[list[str]] = field(default_factory=list)  # init container commands, in order
    ports: dict[str, int] = field(default_factory=dict)  # container port name -> local port

    @property
    def fleet_service(self) -> bool:
        return self.argv[2].startswith("services.")


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion: known variables are replaced, unknown ones stay."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text)


class LocalPlan:
    def __init__(self, objects: list[dict[str, Any]], workdir: Path, *, secrets: dict[tuple[str, str], str],
                 services: dict[str, str], card_map: dict[str, str], replaced: set[str],
                 download_urls: dict[str, str] | None = None):
        """``services``: Service name -> host:port or URL of something the test runs itself
        (e.g. the Redis Service -> the test's redis-server). ``replaced``: components whose
        Deployments are not started (their Services must be in ``services`` if anything uses them)."""
        self.objects, self.workdir = objects, workdir
        self.secrets, self.card_map, self.replaced = secrets, card_map, replaced
        self.download_urls = download_urls or {}
        self.addresses: dict[str, str] = {}  # "svc[.ns.svc.domain]:port" -> "127.0.0.1:local"
        self.external = services
        self.config_dir = workdir / "etc-fastvideo3"
        self.procs: list[ProcSpec] = []
        self._build()

    # -- objects ----------------------------------------------------------------------------
    def of_kind(self, kind: str) -> list[dict]:
        return [o for o in self.objects if o["kind"] == kind and "helm.sh/hook" not in
                o["metadata"].get("annotations", {})]

    def _component(self, obj: dict) -> str:
        return obj["metadata"]["labels"]["app.kubernetes.io/component"]

    def _build(self) -> None:
        deployments = self.of_kind("Deployment")
        local_ports: dict[tuple[str, str], int] = {}  # (component, container port name) -> local
        for dep in deployments:
            comp = self._component(dep)
            if comp in self.replaced:
                continue
            for c in dep["spec"]["template"]["spec"]["containers"]:
                if c["command"][:2] != ["python", "-m"] or not c["command"][2].startswith(MODULES):
                    raise AssertionError(f"Deployment {comp}: container {c['name']} runs {c['command']}, "
                                         "not a fleet process; the plan cannot start it (list it in replaced)")
                for p in c.get("ports", []):
                    local_ports[(comp, p["name"])] = free_port()
        for svc in self.of_kind("Service"):
            name, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
            comp = svc["spec"]["selector"]["app.kubernetes.io/component"]
            for p in svc["spec"]["ports"]:
                if name in self.external:
                    target = self.external[name].split("://")[-1].split("/")[0]
                elif (comp, p["targetPort"]) in local_ports:
                    target = f"127.0.0.1:{local_ports[(comp, p['targetPort'])]}"
                else:
                    continue
                for host in (name, f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"):
                    self.addresses[f"{host}:{p['port']}"] = target
        self._write_config()
        for dep in deployments:
            comp = self._component(dep)
            if comp in self.replaced:
                continue
            self.procs += self._pod(dep, comp, local_ports)
            pods = int(dep["spec"].get("replicas", 1) or 1) if comp == "scheduler" else 1
            for k in range(1, pods):  # further scheduler replicas: the same pod on ports of its own
                own = {key: (free_port() if key[0] == comp else port) for key, port in local_ports.items()}
                self.procs += self._pod(dep, comp, own, replica=k)

    def map_text(self, text: str) -> str:
        """Service addresses -> loopback, mounted paths are left to the caller, cards mapped."""
        for addr in sorted(self.addresses, key=len, reverse=True):
            text = re.sub(rf"(?<![\w.-]){re.escape(addr)}(?![\w.-])", self.addresses[addr], text)
        for card, local in self.card_map.items():
            text = re.sub(rf"(?<![\w.-]){re.escape(card)}(?![\w.-])", local, text)
        return text

    def _write_config(self) -> None:
        (cm,) = [o for o in self.of_kind("ConfigMap") if o["metadata"]["name"].endswith("-config")]
        self.config_dir.mkdir(parents=True, exist_ok=True)
        for key, text in cm["data"].items():
            # the operator's digests belong to the real card's files: kept under its name, so the
            # mapped (tiny) card is checked against its own manifest only
            text = text if key == "checkpoint-digests.yaml" else self.map_text(text)
            (self.config_dir / key).write_text(text.replace("/etc/fastvideo3", str(self.config_dir)))

    # -- one Deployment -> one process -----------------------------------------------------------
    def _volume_dir(self, comp: str, vol: dict) -> Path | None:
        if "configMap" in vol:
            return self.config_dir
        if vol["name"] == "dshm":
            return None  # /dev/shm in a pod is memory: the process uses the host's
        path = self.workdir / f"{comp}-{vol['name']}"
        path.mkdir(parents=True, exist_ok=True)
        if "persistentVolumeClaim" in vol or "hostPath" in vol:
            # the claim / node directory holds the checkpoint: here the tiny card's shipped files
            shutil.copytree(WEIGHTS_DIR, path, dirs_exist_ok=True)
        return path

    def _env(self, container: dict, mounts: dict[str, Path], ports: dict[int, int]) -> dict[str, str]:
        env: dict[str, str] = {}
        for e in container.get("env", []):
            if "value" in e:
                value = self._map_value(_expand(str(e["value"]), env), mounts)
                env[e["name"]] = str(ports.get(int(value), value)) if value.isdigit() else value
                continue
            src = e["valueFrom"]
            if src.get("fieldRef", {}).get("fieldPath") == "status.podIP":
                env[e["name"]] = "127.0.0.1"
            elif "secretKeyRef" in src:
                ref = src["secretKeyRef"]
                env[e["name"]] = self.secrets[(ref["name"], ref["key"])]
            else:
                raise AssertionError(f"env {e['name']}: unsupported source {src}")
        return env

    def _map_value(self, text: str, mounts: dict[str, Path]) -> str:
        for mount, local in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(mount, str(local))
        if text in self.download_urls:
            text = self.download_urls[text]
        return self.map_text(text)

    def _map_args(self, args: list[str], env: dict[str, str], mounts: dict[str, Path],
                  ports: dict[int, int]) -> list[str]:
        out = []
        for a in args:
            flag, eq, value = self._map_value(_expand(a, env), mounts).partition("=")
            if value in self.download_urls:
                value = self.download_urls[value]
            host, colon, port = value.rpartition(":")
            if value.isdigit() and int(value) in ports:  # a container port: its local port
                value = str(ports[int(value)])
            elif host == "127.0.0.1" and colon and port.isdigit() and int(port) in ports:  # $(POD_IP):port
                value = f"{host}:{ports[int(port)]}"
            elif flag == "--metrics-port":
                value = str(free_port())
            elif flag.endswith("host") and value == "0.0.0.0":
                value = "127.0.0.1"
            elif flag == "--device" and value.startswith("cuda"):
                value = "cpu"
            out.append(f"{flag}{eq}{value}")
        return out

    def _pod(self, dep: dict, comp: str, local_ports: dict, replica: int = 0) -> list[ProcSpec]:
        spec = dep["spec"]["template"]["spec"]
        dirs = {v["name"]: self._volume_dir(comp, v) for v in spec.get("volumes", [])}

        def mounts_of(c: dict) -> dict[str, Path]:
            return {m["mountPath"]: dirs[m["name"]] for m in c.get("volumeMounts", []) if dirs.get(m["name"])}

        init = []
        for ic in spec.get("initContainers", []):
            cmd = self._map_args(ic["command"], self._env(ic, mounts_of(ic), {}), mounts_of(ic), {})
            if cmd[:2] == ["python", "-m"]:
                cmd[0] = sys.executable
            init.append(cmd)
        out = []
        for i, c in enumerate(spec["containers"]):
            ports = {p["containerPort"]: local_ports[(comp, p["name"])] for p in c.get("ports", [])}
            env = self._env(c, mounts_of(c), ports)
            module = c["command"][2]
            argv = [sys.executable, "-m", module] + self._map_args(c.get("args", []), env, mounts_of(c), ports)
            if int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0) or 0) > 0:
                # `auto` on a GPU pool offers NIXL (and CUDA IPC); on this CPU stand-in, offer what a
                # CPU can run of that set, NIXL included, so the chart's edge choice is exercised
                argv = [("--transport=shm,grpc,nixl" if a == "--transport=auto" else a) for a in argv]
            service = module.startswith("services.")
            pod = comp if replica == 0 else f"{comp}-{replica}"
            out.append(ProcSpec(
                pod if i == 0 else f"{pod}-{c['name']}", module.split(".", 1)[1] if service else module,
                local_ports.get((comp, "grpc")) if service else None,
                argv + (["--exit-with-parent"] if service else []), env, init if i == 0 else [],
                {p["name"]: local_ports[(comp, p["name"])] for p in c.get("ports", [])}))
        return out


def weights_archive(path: Path) -> Path:
    """A tar.gz of the tiny card's weights in the checkpoint-root layout (a download source's URL)."""
    with tarfile.open(path, "w:gz") as tf:
        for p in sorted(WEIGHTS_DIR.rglob("*.safetensors")):
            tf.add(p, arcname=str(p.relative_to(WEIGHTS_DIR)))
    return path


class RenderedFleet(LocalFleet):
    """A LocalFleet whose processes are a LocalPlan's: the scheduler first, then the pools (all
    followed over grpc.health.v1); then the other processes (Dynamo), which the caller checks
    for readiness in their own way (:meth:`other`)."""

    def __init__(self, plan: LocalPlan, log_dir: Path):
        super().__init__(log_dir=log_dir, roles=())
        self.plan = plan
        self._envs: dict[str, dict[str, str]] = {}
        self.others: dict[str, subprocess.Popen] = {}

    def other(self, name: str) -> subprocess.Popen:
        return self.others[name]

    def log_of(self, name: str, n: int = 40) -> str:
        path = self.log_dir / f"{name}.log"
        lines = path.read_text(errors="replace").splitlines()[-n:] if path.exists() else []
        return f"----- {name} -----\n" + "\n".join(lines)

    def _spawn(self, fp: FleetProcess) -> FleetProcess:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**self._env(), **self._envs.get(fp.name, {})}
        with open(fp.log_path, "ab") as log:
            fp.proc = subprocess.Popen(fp.argv, cwd=str(REPO_ROOT), env=env, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        threading.Thread(target=self._watch, args=(fp,), name=f"health-{fp.name}", daemon=True).start()
        return fp

    def run_init(self, timeout_s: float = 120.0) -> None:
        for spec in self.plan.procs:
            for i, cmd in enumerate(spec.init):
                env = {**self._env(), **spec.env}
                done = subprocess.run(cmd, cwd=str(REPO_ROOT), env=env, capture_output=True, text=True,
                                      timeout=timeout_s)
                if done.returncode != 0:
                    raise AssertionError(f"{spec.name} init container {i} {cmd} failed:\n{done.stderr[-2000:]}")

    def start(self, timeout_s: float = 300.0) -> "RenderedFleet":
        try:
            self.run_init()
            services = [s for s in self.plan.procs if s.fleet_service]
            for spec in sorted(services, key=lambda s: s.role != "scheduler"):
                fp = FleetProcess(spec.name, spec.role, spec.port, spec.argv, self.log_dir / f"{spec.name}.log")
                self._envs[spec.name] = spec.env
                if spec.role == "scheduler":
                    self.schedulers.append(self._spawn(fp))
                else:
                    self.pools.setdefault(spec.role, []).append(self._spawn(fp))
            self.wait_serving(timeout_s)
            for spec in self.plan.procs:
                if not spec.fleet_service:
                    with open(self.log_dir / f"{spec.name}.log", "ab") as log:
                        self.others[spec.name] = subprocess.Popen(
                            spec.argv, cwd=str(REPO_ROOT), env={**self._env(), **spec.env}, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> dict[str, int | None]:
        """The other processes first (they call the scheduler), then the fleet."""
        codes: dict[str, int | None] = {}
        for proc in self.others.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.others.items():
            try:
                codes[name] = proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                codes[name] = proc.wait(timeout=10)
        for proc in self.others.values():  # nothing of theirs is left in their sessions
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return {**codes, **super().stop()}

