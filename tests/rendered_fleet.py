"""Run what the Helm chart renders as local processes: the container command, args and env of
every fleet Deployment, with the cluster mapped onto this machine.

    plan = LocalPlan(objects, workdir, secrets={("fastvideo3-redis", "url"): redis_url},
                     services={"fv-fastvideo3-redis": redis_url}, card_map={"wan2.1-t2v-1.3b": "wan-tiny"})
    with RenderedFleet(plan) as fleet: FleetClient(fleet.target).generate(...)

The mapping, and nothing else, is what differs from a pod:
- one process per Deployment (replicas are a scheduling matter); `python` is this interpreter;
- every container port gets a free loopback port; Service DNS names (short or FQDN) with a
  Service port become 127.0.0.1:<the port of the container the Service selects>;
- `--host=<listenHost>` and $(POD_IP) become 127.0.0.1; `--metrics-port` gets a free port;
- cards are mapped (a GPU card to the tiny card) in args and in the mounted config files;
- volumes: the ConfigMap is written to a directory; a model volume (claim, hostPath, emptyDir)
  is a directory; a claim or hostPath is filled with the tiny card's weights (the test plays
  the volume's content), an emptyDir is filled by running the rendered init container, whose
  URL is mapped to a local archive of those weights;
- env: values as rendered with $(VAR) expansion, fieldRef status.podIP, secretKeyRef from `secrets`;
- every process gets --exit-with-parent, so none outlives the test.
Deployments whose command is not `python -m services.*` must be given in `replaced`
(e.g. the bundled Redis, played by the test's redis-server) or the plan refuses them.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleet.launcher import REPO_ROOT, FleetProcess, LocalFleet, free_port

WEIGHTS_DIR = REPO_ROOT / "fastvideo3" / "weights"
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass
class ProcSpec:
    name: str  # the Deployment's component
    role: str  # scheduler | encoder | ... (from `-m services.<role>`)
    port: int
    argv: list[str]
    env: dict[str, str]
    init: list[list[str]] = field(default_factory=list)  # init container commands, in order


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
                if c["command"][:2] != ["python", "-m"] or not c["command"][2].startswith("services."):
                    raise AssertionError(f"Deployment {comp}: container {c['name']} runs {c['command']}, "
                                         "not a fleet service; the plan cannot start it (list it in replaced)")
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
            if comp not in self.replaced:
                self.procs.append(self._proc(dep, comp, local_ports))

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

    def _env(self, container: dict) -> dict[str, str]:
        env: dict[str, str] = {}
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = self.map_text(_expand(str(e["value"]), env))
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

    def _map_args(self, args: list[str], env: dict[str, str], mounts: dict[str, Path], port: int) -> list[str]:
        out = []
        for a in args:
            a = _expand(a, env)
            for mount, local in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
                a = a.replace(mount, str(local))
            if a.startswith("--url=") and a[6:] in self.download_urls:
                a = f"--url={self.download_urls[a[6:]]}"
            a = self.map_text(a)
            flag, eq, value = a.partition("=")
            if flag == "--port":
                a = f"--port={port}"
            elif flag == "--metrics-port":
                a = f"--metrics-port={free_port()}"
            elif flag == "--host":
                a = "--host=127.0.0.1"
            elif flag == "--device" and value.startswith("cuda"):
                a = "--device=cpu"
            out.append(a)
        return out

    def _proc(self, dep: dict, comp: str, local_ports: dict) -> ProcSpec:
        spec = dep["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        dirs = {v["name"]: self._volume_dir(comp, v) for v in spec.get("volumes", [])}
        mounts = {m["mountPath"]: dirs[m["name"]] for m in c.get("volumeMounts", []) if dirs.get(m["name"])}
        env = self._env(c)
        port = local_ports[(comp, "grpc")]
        argv = [sys.executable, "-m", c["command"][2]] + self._map_args(c.get("args", []), env, mounts, port)
        init = []
        for ic in spec.get("initContainers", []):
            imounts = {m["mountPath"]: dirs[m["name"]] for m in ic.get("volumeMounts", []) if dirs.get(m["name"])}
            cmd = self._map_args(ic["command"], self._env(ic), imounts, port)
            if cmd[:2] == ["python", "-m"]:
                cmd[0] = sys.executable
            init.append(cmd)
        return ProcSpec(comp, c["command"][2].split(".", 1)[1], port, argv + ["--exit-with-parent"], env, init)


def weights_archive(path: Path) -> Path:
    """A tar.gz of the tiny card's weights in the checkpoint-root layout (a download source's URL)."""
    with tarfile.open(path, "w:gz") as tf:
        for p in sorted(WEIGHTS_DIR.rglob("*.safetensors")):
            tf.add(p, arcname=str(p.relative_to(WEIGHTS_DIR)))
    return path


class RenderedFleet(LocalFleet):
    """A LocalFleet whose processes are a LocalPlan's (scheduler first, then the pools)."""

    def __init__(self, plan: LocalPlan, log_dir: Path):
        super().__init__(log_dir=log_dir, roles=())
        self.plan = plan
        self._envs: dict[str, dict[str, str]] = {}

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
            for spec in sorted(self.plan.procs, key=lambda s: s.role != "scheduler"):
                fp = FleetProcess(spec.name, spec.role, spec.port, spec.argv, self.log_dir / f"{spec.name}.log")
                self._envs[spec.name] = spec.env
                if spec.role == "scheduler":
                    self.schedulers.append(self._spawn(fp))
                else:
                    self.pools.setdefault(spec.role, []).append(self._spawn(fp))
            self.wait_serving(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

