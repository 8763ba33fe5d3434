"""The DeploymentCard wire form the scheduler serves in Describe.

Built once at startup from the card, the pools' Describe replies and the per-edge transport
choice; live numbers (queue, counters, pool health) are added per call by the servicer.
"""
from __future__ import annotations

import time

import fastvideo3
from fastvideo3.v1 import common_pb2, deployment_pb2
from fastvideo3.vocab import OutputFormat, PROGRAM_LOOPS, Program, Role, Sampler, Task
from services.common.pool import KINDS
from services.scheduler.config import SchedulerConfig

PROGRAMS = PROGRAM_LOOPS


def build_card(cfg: SchedulerConfig, card, replicas: dict[str, list], edges: dict[str, str],
               health_services: list[str], cost_model=None) -> deployment_pb2.DeploymentCard:
    lim, den = card.limits, card.denoise
    from services.scheduler.app import denoiser_replica
    denoiser = denoiser_replica(replicas).last_description
    summary = deployment_pb2.ModelCardSummary(
        card_id=card.model_id, family=card.family, capabilities=[Program.T2V] + (
            [Task.IMAGE_TO_VIDEO] if Task.IMAGE_TO_VIDEO in card.capabilities.tasks else []),
        recipe=card.recipe.method,
        precision=_precision(denoiser),
        runtime_fingerprint=denoiser.runtime_fingerprint,
        limits=deployment_pb2.RequestLimits(
            min_frames=lim.min_frames, max_frames=lim.max_frames, frames_multiple=4, frames_offset=1,
            min_height=lim.min_size, max_height=lim.max_height, min_width=lim.min_size, max_width=lim.max_width,
            size_multiple=lim.size_multiple, min_steps=den.min_steps, max_steps=den.max_steps,
            min_guidance_scale=0.0, max_guidance_scale=lim.max_guidance, max_prompt_tokens=card.max_text_tokens,
            samplers=[Sampler.UNIPC, Sampler.EULER], output_formats=[OutputFormat.MP4, OutputFormat.NPY]),
        defaults=deployment_pb2.RequestDefaults(
            num_frames=lim.default_frames, height=lim.default_height, width=lim.default_width,
            num_inference_steps=card.recipe.assumes_steps or den.default_steps or 50,
            guidance_scale=lim.default_guidance, flow_shift=den.sampler.flow_shift if den.sampler else 3.0,
            sampler=den.sampler.name if den.sampler else Sampler.UNIPC, fps=lim.fps),
    )
    from services.scheduler.plans import plan_entry, replica_plan
    pools, endpoints, plans = [], [], []
    for role, reps in replicas.items():
        d0 = reps[0].last_description
        plan = plan_entry(replica_plan(d0), d0.device)
        plans.append(deployment_pb2.ParallelPlan(role=role, **plan))
        pools.append(deployment_pb2.RolePoolSpec(
            role=role, replicas=len(reps), card_ids=[card.model_id], kinds=KINDS.get(role, []),
            max_batch_units=d0.max_batch_units, transport_backends=list(d0.transport_backends),
            parallel_plan=plan["name"],
            device=deployment_pb2.DeviceNeeds(accelerator="" if "cpu" in d0.device else d0.device,
                                              gpus=plan["gpus"])))
        eps = []
        for rep in reps:
            for ep in rep.last_description.transfer_endpoints:
                eps.append(common_pb2.TransferEndpoint(backend=ep.backend, address=ep.address or rep.target,
                                                       replica_id=ep.replica_id))
        endpoints.append(deployment_pb2.RoleEndpoints(role=role, endpoints=eps))
    programs = [deployment_pb2.ProgramSpec(name=n, loops=list(loops), card_ids=[card.model_id])
                for n, loops in PROGRAMS.items() if n == Program.T2V or Role.REWARD in replicas]
    labels = {f"transport.{edge}": backend for edge, backend in edges.items()}
    labels["batching"] = "on" if cfg.batching else "off"
    labels["batch_invariant"] = "on" if cfg.batch_bucket(cfg.max_batch) else "off"
    return deployment_pb2.DeploymentCard(
        engine_id=cfg.engine_id, version=fastvideo3.__version__, schema_version="1", models=[summary],
        capability_matrix=[deployment_pb2.CapabilityCell(card_id=card.model_id, capability=Program.T2V,
                                                         level="supported")],
        role_pools=pools, programs=programs,
        parallel_plans=plans,
        health=deployment_pb2.HealthSchema(protocol="grpc.health.v1", services=health_services, check_interval_s=2.0,
                                           unhealthy_after_s=10.0),
        transfer_endpoints=endpoints, default_model=card.model_id, created_unix_ms=int(time.time() * 1000),
        labels=labels, cost_model=cost_model_spec(cost_model) if cost_model is not None else None,
    )


def cost_model_spec(model) -> deployment_pb2.CostModelSpec:
    """The scheduler's own cost model, serialized: the object that prices admission is the one
    the fleet publishes (calibration state included, as of this call)."""
    import json
    return deployment_pb2.CostModelSpec(version="1", unit="gpu_seconds",
                                        cost_model_json=json.dumps(model.to_dict()).encode(),
                                        calibrated_unix_ms=int(time.time() * 1000))


def _precision(desc) -> str:
    import json
    return str(json.loads(desc.description_json or b"{}").get("executor", {}).get("precision", ""))
