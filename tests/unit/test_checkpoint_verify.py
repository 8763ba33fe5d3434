"""Start-up checks of a card's weight files (fastvideo3/card/verify.py) and how a pool that
fails them behaves: NOT_SERVING, Describe state "failed" with the file named, the log names it,
exit status 2."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fastvideo3.card.registry import bind_checkpoint, builtin_cards, get_card
from fastvideo3.models.wan.cards import SHIPPED_DIGESTS
from fastvideo3.card.spec import CheckpointManifest
from fastvideo3.card.verify import ROLE_KINDS, file_digest, load_digest_file, main, verify_checkpoint
from fastvideo3.errors import CardError

REPO_ROOT = Path(__file__).resolve().parents[2]
WEIGHTS = REPO_ROOT / "fastvideo3" / "weights"


def test_shipped_digests_match_the_package_files() -> None:
    on_disk = {str(p.relative_to(WEIGHTS)): file_digest(p) for p in WEIGHTS.rglob("*.safetensors")}
    assert on_disk == SHIPPED_DIGESTS, ("shipped weights changed: regenerate SHIPPED_DIGESTS with "
                                        "python -m fastvideo3.card.verify --card wan-tiny --print-digests")


@pytest.mark.parametrize("card_id", ["wan-tiny", "wan-tiny-4step"])
def test_tiny_cards_carry_and_pass_their_digests(card_id: str) -> None:
    card = get_card(card_id)
    shipped = {c.subfolder for c in card.components.values()}
    assert set(card.checkpoint.digests) == shipped
    assert verify_checkpoint(card) == {k: SHIPPED_DIGESTS[k] for k in shipped}
    # each role hashes only what it loads
    assert list(verify_checkpoint(card, ROLE_KINDS["decoder"])) == ["wan-tiny/vae.safetensors"]
    assert verify_checkpoint(card, ROLE_KINDS["reward"]) == {}


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(WEIGHTS, root)
    return root


def test_corrupt_and_missing_files_are_named(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    card = bind_checkpoint(get_card("wan-tiny"), root)
    assert len(verify_checkpoint(card)) == 3
    with open(root / "wan-tiny" / "vae.safetensors", "r+b") as fh:
        fh.seek(-1, 2)
        last = fh.read(1)
        fh.seek(-1, 2)
        fh.write(bytes([last[0] ^ 1]))
    with pytest.raises(CardError) as err:
        verify_checkpoint(card, ROLE_KINDS["decoder"])
    assert err.value.field == "checkpoint.wan-tiny/vae.safetensors" and "has digest" in str(err.value)
    assert "wan-tiny/vae.safetensors" not in verify_checkpoint(card, ROLE_KINDS["denoiser"])  # not its file
    (root / "wan-tiny" / "transformer.safetensors").unlink()
    with pytest.raises(CardError) as err:
        verify_checkpoint(card, ROLE_KINDS["denoiser"])
    assert err.value.field == "checkpoint.wan-tiny/transformer.safetensors" and "missing" in str(err.value)


def test_operator_digests_win_and_are_validated(tmp_path: Path) -> None:
    card = get_card("wan-tiny")
    wrong = {"wan-tiny/transformer.safetensors": "sha256:" + "0" * 64}
    with pytest.raises(CardError, match="transformer.safetensors"):
        verify_checkpoint(card, ROLE_KINDS["denoiser"], wrong)
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump({"wan-tiny": wrong, "other": {}}))
    assert load_digest_file(path, "wan-tiny") == wrong and load_digest_file(path, "nope") == {}
    path.write_text(yaml.safe_dump({"wan-tiny": {"../x": "sha256:" + "0" * 64}}))
    with pytest.raises(CardError, match="relative path"):
        load_digest_file(path, "wan-tiny")
    with pytest.raises(ValueError, match="sha256"):
        CheckpointManifest(digests={"a.safetensors": "md5:00"})


def test_diffusers_directory_presence_and_digests(tiny_wan_dir: Path, tmp_path: Path, capsys) -> None:
    root = tmp_path / "wan"
    shutil.copytree(tiny_wan_dir, root)
    card = bind_checkpoint(get_card("wan2.1-t2v-1.3b"), root)
    assert verify_checkpoint(card) == {}  # no digests: presence only
    assert main(["--card", "wan2.1-t2v-1.3b", "--checkpoint-root", str(root), "--print-digests"]) == 0
    digests = yaml.safe_load(capsys.readouterr().out)["wan2.1-t2v-1.3b"]
    assert any(k.startswith("transformer/") and k.endswith(".safetensors") for k in digests)
    assert "vae/config.json" in digests and "scheduler/scheduler_config.json" in digests
    assert verify_checkpoint(card, extra_digests=digests) == digests
    shard = next(root / k for k in sorted(digests) if k.startswith("transformer/") and k.endswith(".safetensors"))
    shard.unlink()
    with pytest.raises(CardError) as err:  # without digests the name of a lost single shard is unknown
        verify_checkpoint(card, ROLE_KINDS["denoiser"])
    assert err.value.field == "checkpoint.transformer/*.safetensors"
    with pytest.raises(CardError) as err:  # with them it is named
        verify_checkpoint(card, ROLE_KINDS["denoiser"], digests)
    assert err.value.field == f"checkpoint.transformer/{shard.name}" and "missing" in str(err.value)
    assert verify_checkpoint(card, ROLE_KINDS["decoder"], digests)  # other roles are unaffected
    with pytest.raises(CardError) as err:
        verify_checkpoint(get_card("wan2.1-t2v-1.3b"), ROLE_KINDS["denoiser"])
    assert err.value.field == "checkpoint.root"
    shutil.rmtree(root / "vae")
    with pytest.raises(CardError, match="directory vae/ is missing"):
        verify_checkpoint(card, ROLE_KINDS["decoder"])


def test_every_builtin_card_declares_digests_for_its_shipped_files() -> None:
    for card in builtin_cards().values():
        shipped = {c.subfolder for c in card.components.values() if c.source == "shipped"}
        assert shipped <= set(card.checkpoint.digests), card.model_id


def _describe(port: int) -> dict | None:
    import grpc

    from fastvideo3.v1 import pool_pb2, pool_pb2_grpc
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        try:
            d = pool_pb2_grpc.RolePoolStub(ch).Describe(pool_pb2.DescribePoolRequest(), timeout=5)
        except grpc.RpcError:
            return None
    from fastvideo3.rpc import plain
    return plain(d)


@pytest.mark.timeout(300)
def test_pool_with_a_corrupt_file_stays_not_serving_and_names_it(tmp_path: Path) -> None:
    from fleet.launcher import free_port
    from tests.fleet_fixture import health, wait_until
    root = _copy(tmp_path)
    (root / "wan-tiny" / "transformer.safetensors").write_bytes(b"truncated")
    port = free_port()
    log = tmp_path / "pool.log"
    argv = [sys.executable, "-m", "services.denoiser", "--port", str(port), "--card", "wan-tiny",
            "--checkpoint-root", str(root), "--load-failure-hold", "240", "--exit-with-parent"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        info = wait_until(lambda: (d := _describe(port)) and d["state"] == "failed" and d, 240,
                          "Describe state=failed")
        assert info["load_error"]["field"] == "checkpoint.wan-tiny/transformer.safetensors"
        assert "has digest" in info["load_error"]["message"]
        assert health(f"127.0.0.1:{port}") == "NOT_SERVING"
        assert proc.poll() is None  # held: the reason stays readable
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 2
        assert "wan-tiny/transformer.safetensors" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.timeout(300)
def test_pool_without_hold_exits_at_once_naming_the_file(tmp_path: Path) -> None:
    from fleet.launcher import free_port
    root = _copy(tmp_path)
    (root / "wan-tiny" / "vae.safetensors").unlink()
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "services.decoder", "--port", str(free_port()), "--card", "wan-tiny",
                           "--checkpoint-root", str(root)], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "checkpoint file wan-tiny/vae.safetensors is missing" in done.stdout + done.stderr
    assert time.monotonic() - started < 240


def test_card_file_with_its_own_root_drops_the_base_digests(tmp_path: Path) -> None:
    from fastvideo3.card.registry import load_card_file
    (tmp_path / "a.yaml").write_text("extends: wan-tiny\nmodel_id: retrained\ncheckpoint: {root: out}\n")
    assert load_card_file(tmp_path / "a.yaml").checkpoint.digests == {}
    (tmp_path / "b.yaml").write_text("extends: wan-tiny\nmodel_id: same-weights\n")
    assert load_card_file(tmp_path / "b.yaml").checkpoint.digests == get_card("wan-tiny").checkpoint.digests


def test_pool_start_flags(capsys) -> None:
    from services.common.pool import parse_args
    cfg = parse_args("denoiser", ["--port", "0", "--host", "0.0.0.0", "--advertise-host", "10.1.2.3",
                                  "--checkpoint-root", "/models/w", "--load-failure-hold", "30"])
    assert (cfg.public_host, cfg.checkpoint_root, cfg.load_failure_hold_s) == ("10.1.2.3", "/models/w", 30.0)
    assert parse_args("decoder", ["--port", "0"]).public_host == "127.0.0.1"
    with pytest.raises(SystemExit):
        parse_args("decoder", ["--port", "0", "--load-failure-hold", "-1"])
    assert "--load-failure-hold must be >= 0 (got -1.0)" in capsys.readouterr().err
