"""Model sources in the chart (modelSources.<card>): volumes, mounts, init containers, pool
flags, the digests file, and the render failures that name the field."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

try:
    from helm_render import (
        CHART_DIR, VALUES_DIR, Rendered, name, render, render_error, require_helm, template_fail_test,
    )
except ImportError:  # tests/unit imported as a package
    from tests.unit.helm_render import (  # type: ignore[no-redef]
        CHART_DIR,
        VALUES_DIR,
        Rendered,
        name,
        render,
        render_error,
        require_helm,
        template_fail_test,
    )

CARD = "wan2.1-t2v-1.3b"
KEY = "modelSources." + CARD.replace(".", "\\.")
DIGEST = "sha256:" + "ab" * 32
ROLES = ("encoder", "denoiser", "decoder", "reward")
timeout = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def helm() -> str:
    return require_helm()


def with_card(helm: str, *sets: str) -> Rendered:
    return Rendered(render(helm, set_values=[f"card={CARD}", *sets]))


def pool(r: Rendered, role: str) -> tuple[dict, dict]:
    spec = r.get("Deployment", name(role))["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    return spec, c


def validate_strict(r: Rendered) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    for obj in r.objects:
        kv.validate(obj, "1.31", strict=True)


@timeout
def test_claim_is_mounted_read_only_at_the_checkpoint_root(helm: str) -> None:
    r = with_card(helm, f"{KEY}.persistentVolumeClaim.claimName=wan-weights")
    validate_strict(r)
    for role in ROLES:
        spec, c = pool(r, role)
        assert "--checkpoint-root=/models/wan2.1-t2v-1.3b" in c["args"]
        assert not any(a.startswith("--checkpoint-digests") for a in c["args"])
        vol = {v["name"]: v for v in spec["volumes"]}["model"]
        assert vol["persistentVolumeClaim"] == {"claimName": "wan-weights", "readOnly": True}
        mount = {m["name"]: m for m in c["volumeMounts"]}["model"]
        assert mount == {"name": "model", "mountPath": "/models/wan2.1-t2v-1.3b", "readOnly": True}
        assert "initContainers" not in spec
    assert "checkpoint-digests.yaml" not in r.config()


@timeout
def test_host_path_and_custom_mount_path(helm: str) -> None:
    r = with_card(helm, f"{KEY}.hostPath.path=/var/lib/models/wan", f"{KEY}.mountPath=/weights")
    validate_strict(r)
    spec, c = pool(r, "denoiser")
    assert {v["name"]: v for v in spec["volumes"]}["model"]["hostPath"] == {
        "path": "/var/lib/models/wan", "type": "Directory"}
    assert "--checkpoint-root=/weights" in c["args"]


@timeout
def test_download_runs_an_init_container_into_an_empty_dir(helm: str) -> None:
    r = with_card(helm, f"{KEY}.download.url=https://models.example.com/wan.tar.gz",
                  f"{KEY}.download.sizeLimit=40Gi", f"{KEY}.digests.transformer/a\\.safetensors={DIGEST}")
    validate_strict(r)
    spec, c = pool(r, "decoder")
    (init,) = spec["initContainers"]
    assert init["image"] == c["image"]  # the pool's own image carries the fetcher
    assert init["command"] == ["python", "-m", "fastvideo3.card.fetch", "--url=https://models.example.com/wan.tar.gz",
                               "--dest=/models/wan2.1-t2v-1.3b", "--clean", "--timeout=3600"]
    assert init["volumeMounts"] == [{"name": "model", "mountPath": "/models/wan2.1-t2v-1.3b"}]
    assert {v["name"]: v for v in spec["volumes"]}["model"]["emptyDir"] == {"sizeLimit": "40Gi"}
    assert "--checkpoint-digests=/etc/fastvideo3/checkpoint-digests.yaml" in c["args"]
    assert r.config()["checkpoint-digests.yaml"] == {CARD: {"transformer/a.safetensors": DIGEST}}


@timeout
def test_object_store_download_into_an_ephemeral_volume(helm: str) -> None:
    r = with_card(helm, f"{KEY}.download.url=s3://bucket/wan/", f"{KEY}.download.image=amazon/aws-cli:2.27.0",
                  f"{KEY}.download.ephemeral.enabled=true", f"{KEY}.download.ephemeral.size=50Gi",
                  f"{KEY}.download.ephemeral.storageClassName=fast")
    validate_strict(r)
    spec, _ = pool(r, "encoder")
    (init,) = spec["initContainers"]
    assert init["image"] == "amazon/aws-cli:2.27.0"
    assert init["command"] == ["aws", "s3", "sync", "--only-show-errors", "s3://bucket/wan/", "/models/wan2.1-t2v-1.3b"]
    claim = {v["name"]: v for v in spec["volumes"]}["model"]["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim["resources"]["requests"]["storage"] == "50Gi" and claim["storageClassName"] == "fast"


@timeout
def test_pools_listen_on_the_pod_and_advertise_its_ip(helm: str) -> None:
    r = Rendered(render(helm))
    for role in ROLES:
        _, c = pool(r, role)
        assert {"--host=0.0.0.0", "--advertise-host=$(POD_IP)", "--load-failure-hold=300"} <= set(c["args"])
        assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert {e["name"] for e in c["env"]} >= {"POD_IP"}
    sched = r.get("Deployment", name("scheduler"))["spec"]["template"]["spec"]["containers"][0]
    assert "--host=0.0.0.0" in sched["args"]


@timeout
def test_gpu_production_has_a_source_for_its_card(helm: str) -> None:
    r = Rendered(render(helm, [VALUES_DIR / "gpu-production.yaml"]))
    for role in ROLES:
        spec, c = pool(r, role)
        assert any(a.startswith("--checkpoint-root=/models/") for a in c["args"])
        assert "persistentVolumeClaim" in {v["name"]: v for v in spec["volumes"]}["model"]


FAILS = [
    ([f"card={CARD}", "pools.denoiser.gpu=1", "pools.encoder.card=wan-tiny"],
     f"modelSources.{CARD} is required: pools.denoiser (gpu: 1) serves card {CARD}"),
    ([f"card={CARD}"], f"modelSources.{CARD} is required: pools.encoder serves card {CARD}"),
    ([f"{KEY}.hostPath.path=/a", f"{KEY}.download.url=https://a/b"],
     f"modelSources.{CARD} needs exactly one of persistentVolumeClaim, hostPath, download (got 2"),
    ([f"{KEY}.mountPath=x"], f"modelSources.{CARD} needs exactly one"),
    ([f"{KEY}.hostPath.path=/a", f"{KEY}.mountPath=/etc/fastvideo3/w"],
     f"modelSources.{CARD}.mountPath /etc/fastvideo3/w"),
    ([f"{KEY}.hostPath.path=rel"], f"modelSources.{CARD}.hostPath.path must be an absolute path"),
    ([f"{KEY}.persistentVolumeClaim.subPath=x"], f"modelSources.{CARD}.persistentVolumeClaim.claimName is required"),
    ([f"{KEY}.download.url=ftp://x"], f"modelSources.{CARD}.download.url must start with"),
    ([f"{KEY}.download.url=gs://b/p"], f"modelSources.{CARD}.download.image is required for gs URLs"),
    ([f"{KEY}.download.url=https://a/b.tar", f"{KEY}.download.ephemeral.enabled=true"],
     f"modelSources.{CARD}.download.ephemeral.size is required"),
    ([f"{KEY}.hostPath.path=/a", f"{KEY}.digests.x=md5:1"], f"modelSources.{CARD}.digests[x] must be sha256"),
    ([f"{KEY}.hostPath.path=/a", f"{KEY}.digests.\\.\\./x={DIGEST}"], "must be a path relative to the checkpoint root"),
    (["listenHost=pod"], "listenHost must be an IP address"),
    (["loadFailureHoldSeconds=-1"], "loadFailureHoldSeconds must be >= 0"),
]

test_template_fail_names_the_field = template_fail_test(FAILS, id_chars=48, timeout_s=120, execution_error=False)


@timeout
@pytest.mark.parametrize(("sets", "where"), [
    ([f"{KEY}.hostPath.path=rel"], f"/modelSources/{CARD}/hostPath/path"),
    ([f"{KEY}.download.url=ftp://x"], f"/modelSources/{CARD}/download/url"),
    ([f"{KEY}.hostPath.path=/a", f"{KEY}.digests.x=md5:1"], f"/modelSources/{CARD}/digests/x"),
    ([f"{KEY}.pvc.claimName=x"], "pvc"),
])
def test_schema_names_the_field(helm: str, sets: list[str], where: str) -> None:
    err = render_error(helm, set_values=sets)
    assert where in err


def test_self_contained_cards_match_the_registry() -> None:
    from fastvideo3.card.registry import builtin_cards
    text = (CHART_DIR / "templates" / "_models.tpl").read_text()
    chart = re.search(r'define "fastvideo3.selfContainedCards" -}}\n(.*)\n', text).group(1).split()
    registry = [cid for cid, card in builtin_cards().items()
                if all(c.source != "diffusers_dir" for c in card.components.values())]
    assert sorted(chart) == sorted(registry)


@timeout
def test_rendered_download_command_fills_the_volume(helm: str, tmp_path: Path) -> None:
    """The default init container command, run here on a local archive, lays out the root."""
    weights = Path(__file__).resolve().parents[2] / "fastvideo3" / "weights"
    archive = tmp_path / "w.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(weights / "wan-tiny", arcname="wan-tiny")
    r = with_card(helm, f"{KEY}.download.url={archive.as_uri()}", f"{KEY}.download.timeoutSeconds=60")
    (init,) = pool(r, "denoiser")[0]["initContainers"]
    dest = tmp_path / "vol"
    dest.mkdir()
    (dest / "stale").write_text("from an earlier, interrupted copy")
    cmd = [sys.executable if a == "python" else a.replace("/models/wan2.1-t2v-1.3b", str(dest))
           for a in init["command"]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (dest / "wan-tiny").iterdir()) == sorted(
        p.name for p in (weights / "wan-tiny").iterdir())
    assert not (dest / "stale").exists()


def test_fetch_refuses_archive_escapes(tmp_path: Path) -> None:
    from fastvideo3.card.fetch import main
    evil = tmp_path / "evil.tar"
    with tarfile.open(evil, "w") as tf:
        (tmp_path / "x").write_text("x")
        tf.add(tmp_path / "x", arcname="../escaped")
    assert main(["--url", evil.as_uri(), "--dest", str(tmp_path / "d")]) == 1
    assert not (tmp_path / "escaped").exists()
    assert main(["--url", "ftp://host/x.tar", "--dest", str(tmp_path / "d")]) == 1
    assert main(["--url", (tmp_path / "missing.tar").as_uri(), "--dest", str(tmp_path / "d")]) == 1


def test_values_comment_documents_every_source_key() -> None:
    text = (CHART_DIR / "values.yaml").read_text()
    block = text.split("modelSources: {}")[0].rsplit("# -- Where each card's weights", 1)[1]
    schema = yaml.safe_load((CHART_DIR / "values.schema.json").read_text())["definitions"]["modelSource"]
    for key in schema["properties"]:
        assert re.search(rf"\b{key}:", block), key
    for key in schema["properties"]["download"]["properties"]:
        assert re.search(rf"\b{key}:", block), f"download.{key}"
