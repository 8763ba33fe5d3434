"""DeploymentCard: build, wire round-trip, JSON schema, validation, fleet config and the CLI."""
from __future__ import annotations

import argparse
import json
import math
from concurrent import futures

import grpc
import jsonschema
import pytest
import yaml

from fastvideo3.card.registry import builtin_cards, get_card
from fastvideo3.errors import InvalidRequest
from fastvideo3.runtime.economy.cost import CalibratedCostModel, DiffusionStepFeatures, device_profile
from fastvideo3.models.wan.flops import DitConfig, StepShape
from fastvideo3.v1 import deployment_pb2
from fleet.deployment_card import (
    HEALTH_LABEL_PREFIX, DeploymentCard, SloClass, build_deployment_card, card_for_model,
    card_from_fleet_config, parse_card,
)

pytestmark = pytest.mark.timeout(60)

POOLS = [
    {"role": "encoder", "replicas": 1, "device": {"gpus": 1, "gpu_memory_bytes": 24 << 30}},
    {"role": "denoiser", "replicas": 4, "device": {"gpus": 2, "gpu_memory_bytes": 141 << 30,
                                                   "host_memory_bytes": 64 << 30, "accelerator": "h200"},
     "parallel_plan": "tp2", "transport_backends": ["nixl", "grpc"], "max_batch_units": 16},
    {"role": "decoder", "replicas": 2, "device": {"gpus": 1}},
    {"role": "reward", "replicas": 1},
]
ENDPOINTS = {"denoiser": [("nixl", "agent-denoiser-0", "denoiser-0"), ("grpc", "10.0.0.5:50053")],
             "decoder": [("shm", "fv3-decoder-0")]}


def _features(frames: int = 81) -> DiffusionStepFeatures:
    return DiffusionStepFeatures(DitConfig.wan21_1_3b(), StepShape.from_video(frames, 480, 832, cfg_branches=2))


def calibrated_model() -> CalibratedCostModel:
    """A cost model that has learned something: its windows must survive the trip."""
    model = CalibratedCostModel(device=device_profile("h200"))
    for i, frames in enumerate((81, 81, 81, 81, 81, 81, 33)):
        f = _features(frames)
        pred = model.predict("diffusion_step", f.shape.key(), f)
        model.observe("diffusion_step", f.shape.key(), pred.prior_seconds * (1.3 + 0.01 * i), pred)
    return model


def full_card(cost_model: CalibratedCostModel | None = None) -> DeploymentCard:
    cards = [builtin_cards()["wan2.1-t2v-1.3b"], get_card("wan-tiny")]
    return build_deployment_card(cards, POOLS, cost_model or calibrated_model(), ENDPOINTS,
                                 engine_id="fastvideo3/prod.video", labels={"team": "video"},
                                 fingerprints={"wan-tiny": "fnv1a64:0123456789abcdef"}, created_unix_ms=1_700_000_000_000)


def test_build_describes_models_pools_programs_and_endpoints():
    card = full_card()
    assert card.default_model == "wan2.1-t2v-1.3b"
    assert [m.card_id for m in card.models] == ["wan2.1-t2v-1.3b", "wan-tiny"]
    real = card.model("wan2.1-t2v-1.3b")
    assert real.capabilities[0] == "t2v" and real.precision == "bf16"  # the denoiser has GPUs
    assert (real.limits.frames_multiple, real.limits.frames_offset) == (4, 1)
    assert real.defaults.num_inference_steps == 50 and real.limits.max_prompt_tokens == 512
    assert card.model("wan-tiny").runtime_fingerprint == "fnv1a64:0123456789abcdef"
    den = next(p for p in card.role_pools if p.role == "denoiser")
    assert den.kinds == ["diffusion_step"] and den.device.gpus == 2 and den.replicas == 4
    assert den.card_ids == ["wan2.1-t2v-1.3b", "wan-tiny"]  # a pool naming no card serves all
    assert {p.name: p.degrees for p in card.parallel_plans}["tp2"] == {"tp": 2}
    assert [(p.name, p.loops) for p in card.programs] == [("t2v", ["text_encode", "diffusion_denoise", "vae_decode"])]
    cells = {(c.card_id, c.capability) for c in card.capability_matrix}
    assert ("wan-tiny", "t2v") in cells and ("wan-tiny", "reward_scoring") in cells
    assert [s.name for s in card.slo_classes] == ["interactive", "batch"]
    assert card.health.protocol == "grpc.health.v1" and "" in card.health.serving
    eps = {r.role: [(e.backend, e.address, e.replica_id) for e in r.endpoints] for r in card.transfer_endpoints}
    assert eps["denoiser"][0] == ("nixl", "agent-denoiser-0", "denoiser-0")
    with pytest.raises(InvalidRequest) as e:
        card.model("nope")
    assert e.value.field == "model"


def test_proto_round_trip_is_exact():
    card = full_card()
    msg = card.to_proto()
    assert isinstance(msg, deployment_pb2.DeploymentCard)
    wire = deployment_pb2.DeploymentCard.FromString(msg.SerializeToString())
    back = DeploymentCard.from_proto(wire)
    assert back == card
    assert back.to_proto().SerializeToString(deterministic=True) == msg.SerializeToString(deterministic=True)
    # what SERVING means rides in reserved labels on the wire, and only there
    assert any(k.startswith(HEALTH_LABEL_PREFIX) for k in wire.labels)
    assert back.labels == {"team": "video"}
    assert wire.role_pools[1].device.gpu_memory_bytes == 141 << 30
    assert json.loads(wire.cost_model.cost_model_json)["type"] == "CalibratedCostModel"


def test_minimal_card_round_trips_without_cost_model():
    card = build_deployment_card([get_card("wan-tiny")], [], None, created_unix_ms=0)
    assert card.cost_model is None and card.role_pools == []
    assert DeploymentCard.from_proto(card.to_proto()) == card


def test_published_cost_model_is_the_schedulers_model():
    model = calibrated_model()
    card = full_card(model)
    assert card.cost_model.model == model.to_dict()
    assert card.cost_model.unit == "gpu_seconds"
    loaded = DeploymentCard.from_proto(card.to_proto()).cost_model.load()
    for frames in (81, 33, 17):
        f = _features(frames)
        a, b = model.predict("diffusion_step", f.shape.key(), f), loaded.predict("diffusion_step", f.shape.key(), f)
        assert a == b and math.isfinite(a.gpu_seconds)
    assert loaded.factor("denoiser", "diffusion_step") == pytest.approx(model.factor("denoiser", "diffusion_step"))


def test_output_validates_against_the_json_schema():
    schema = DeploymentCard.model_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for card in (full_card(), card_for_model("wan-tiny")):
        validator.validate(json.loads(card.to_json()))
    bad = full_card().model_dump(mode="json")
    bad["role_pools"][0]["role"] = "gpu"
    assert not validator.is_valid(bad)
    bad = full_card().model_dump(mode="json")
    bad["surprise"] = 1
    assert not validator.is_valid(bad)


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.update(default_model="nope"), "default_model"),
    (lambda d: d["role_pools"][0].update(card_ids=["nope"]), "role_pools"),
    (lambda d: d["role_pools"].append(dict(d["role_pools"][0])), "role_pools.role"),
    (lambda d: d["role_pools"][1].update(parallel_plan="tp8"), "parallel_plan"),
    (lambda d: d["labels"].update({HEALTH_LABEL_PREFIX + "x": "y"}), "reserved prefix"),
    (lambda d: d["health"]["serving"].update({"ghost": "?"}), "health.serving"),
    (lambda d: d["slo_classes"].append(dict(d["slo_classes"][0])), "slo_classes.name"),
    (lambda d: d["role_pools"][0].update(replicas=-1), "role_pools.0.replicas"),
    (lambda d: d.update(models=[]), "models"),
])
def test_inconsistent_cards_are_refused_naming_the_field(mutate, field):
    data = full_card().model_dump(mode="json")
    mutate(data)
    with pytest.raises(InvalidRequest) as e:
        parse_card(data)
    assert field in f"{e.value.field} {e.value.message}"


def test_build_refuses_unknown_slo_fields_and_empty_cards():
    with pytest.raises(InvalidRequest):
        build_deployment_card([], POOLS, None)
    card = build_deployment_card([get_card("wan-tiny")], POOLS, None,
                                 slo_classes=[SloClass(name="gold", priority=5, target_latency_p95_s=20.0)])
    assert [s.name for s in card.slo_classes] == ["gold"]


def test_card_from_a_helm_style_fleet_config(tmp_path):
    (tmp_path / "cards.yaml").write_text(yaml.safe_dump({"cards": {"tiny-2": get_card("wan-tiny").model_copy(
        update={"model_id": "tiny-2"}).model_dump(mode="json")}}))
    cfg = {
        "fleet": {"name": "fv3", "namespace": "video"},
        "scheduler": {"port": 50051},
        "card": "wan-tiny",
        "cards_file": "cards.yaml",
        "pools": {
            "encoder": {"address": "fv3-encoder:50052", "replicas": 1, "gpus_per_replica": 0},
            "denoiser": {"address": "fv3-denoiser:50053", "replicas": 2, "gpus_per_replica": 1, "card": "tiny-2"},
            "decoder": {"address": "fv3-decoder:50054", "replicas": 1},
            "reward": {"enabled": False},
        },
        "cost_model": {"device": "h200"},
        "state_store": {"kind": "redis"},
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(cfg))
    card = card_from_fleet_config(path)
    assert card.engine_id == "fastvideo3/fv3.video"
    assert [m.card_id for m in card.models] == ["wan-tiny", "tiny-2"]
    assert {p.role for p in card.role_pools} == {"encoder", "denoiser", "decoder"}
    den = next(p for p in card.role_pools if p.role == "denoiser")
    assert den.card_ids == ["tiny-2"] and den.transport_backends == ["nixl", "grpc"]
    assert card.cost_model.model["device"]["name"] == "h200"
    assert {r.role: r.endpoints[0].address for r in card.transfer_endpoints}["decoder"] == "fv3-decoder:50054"
    with pytest.raises(InvalidRequest) as e:
        card_from_fleet_config({"pools": {"gpu": {}}})
    assert e.value.field == "pools"


# -- the CLI ------------------------------------------------------------------------------------

def _cli(argv: list[str]) -> int:
    from fastvideo3 import cli_deploy
    parser = argparse.ArgumentParser(prog="fastvideo3")
    cli_deploy.add_commands(parser.add_subparsers(dest="cmd", required=True))
    return cli_deploy.run(parser.parse_args(argv))


def test_cli_prints_a_card_for_a_model_and_a_config(tmp_path, capsys):
    assert _cli(["deployment-card", "--card", "wan-tiny"]) == 0
    card = parse_card(json.loads(capsys.readouterr().out))
    assert card.default_model == "wan-tiny" and card.cost_model is not None
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"card": "wan-tiny", "pools": {"denoiser": {"replicas": 3}}}))
    assert _cli(["deployment-card", "--config", str(path), "--format", "yaml"]) == 0
    card = parse_card(yaml.safe_load(capsys.readouterr().out))
    assert [(p.role, p.replicas) for p in card.role_pools] == [("denoiser", 3)]
    assert _cli(["deployment-card", "--schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "DeploymentCard"
    with pytest.raises(InvalidRequest):
        _cli(["deployment-card"])


def test_cli_reads_a_running_schedulers_card_over_grpc(capsys):
    from fastvideo3.v1 import scheduler_pb2, scheduler_pb2_grpc

    card = full_card()

    class Scheduler(scheduler_pb2_grpc.SchedulerServicer):
        def Describe(self, request, context):
            return scheduler_pb2.SchedulerDescription(card=card.to_proto(), queued_requests=2)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(Scheduler(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        assert _cli(["deployment-card", "--target", f"127.0.0.1:{port}"]) == 0
        assert parse_card(json.loads(capsys.readouterr().out)) == card
    finally:
        server.stop(None)


def test_the_fastvideo3_command_exposes_deployment_card(capsys):
    from fastvideo3.cli import main
    assert main(["deployment-card", "--card", "wan-tiny", "--format", "yaml"]) == 0
    assert parse_card(yaml.safe_load(capsys.readouterr().out)).engine_id == "fastvideo3/wan-tiny"
    assert main(["deployment-card"]) == 2  # no source named: one line, exit status 2
    assert "--target, --config, --card or --schema" in capsys.readouterr().err
