"""Span names, attribute keys and SLO phases: the vocabulary tracing writes and the SLO report reads.

Kept apart from :mod:`fastvideo3.telemetry.tracing` so the report (and anything else that only
reads exported spans) needs no OpenTelemetry import.
"""
from __future__ import annotations

from fastvideo3.vocab import LoopId, Phase, UnitKind

# -- span names ----------------------------------------------------------------------------
SPAN_REQUEST = "fastvideo3.request"  # one per request: the root of the request's trace
SPAN_PHASE = "fastvideo3.phase"  # a named interval (queue_wait, admission, dispatch, ...)
SPAN_LOOP = "fastvideo3.loop"  # one loop of the request's program (encode, denoise, decode)
SPAN_UNIT = "fastvideo3.unit"  # one WorkUnit, scheduler side: planned -> result applied
SPAN_POOL_EXECUTE = "fastvideo3.pool.execute"  # one WorkUnit, pool side (child of its unit span)
SPAN_TRANSFER = "fastvideo3.transfer"  # a tensor pull or push
SPAN_BATCH = "fastvideo3.batch"  # one dispatched batch, scheduler side (its own trace)
SPAN_POOL_BATCH = "fastvideo3.pool.batch"  # the same batch, pool side (same batch trace)

# -- attribute keys ------------------------------------------------------------------------
A_REQUEST_ID = "fastvideo3.request_id"
A_CARD = "fastvideo3.card"
A_SLO_CLASS = "fastvideo3.slo_class"
A_LOOP_ID = "fastvideo3.loop_id"
A_UNIT_ID = "fastvideo3.unit_id"
A_KIND = "fastvideo3.kind"
A_ROLE = "fastvideo3.role"
A_SHAPE_SIG = "fastvideo3.shape_sig"
A_STEP = "fastvideo3.step"
A_BATCH_SIZE = "fastvideo3.batch_size"
A_BATCH_REQUESTS = "fastvideo3.batch_requests"  # distinct requests in the batch
A_PREDICTED_S = "fastvideo3.predicted_gpu_s"
A_MEASURED_S = "fastvideo3.measured_gpu_s"
A_PHASE = "fastvideo3.phase"
A_STATUS = "fastvideo3.status"  # a request's terminal status
A_ERROR_CODE = "fastvideo3.error_code"
A_BACKEND = "fastvideo3.transport"
A_BYTES = "fastvideo3.bytes"
A_SRC = "fastvideo3.src"
A_DST = "fastvideo3.dst"
A_REPLICA = "fastvideo3.replica"
#: the denoiser's CUDA-graph path of a unit's forward: the bucket key (``r4.16x5x32x32.t512``) or
#: ``eager`` (then ``A_GRAPH_EAGER_REASON`` says why), and the padding rows the bucket added
A_GRAPH_BUCKET = "fastvideo3.graph.bucket"
A_GRAPH_PADDING_ROWS = "fastvideo3.graph.padding_rows"
A_GRAPH_EAGER_REASON = "fastvideo3.graph.eager_reason"
GRAPH_EAGER = "eager"

# -- SLO phases ----------------------------------------------------------------------------
#: unit kind -> the phase its scheduler-side unit span reports under
KIND_PHASE = {
    UnitKind.ENCODER_CHUNK: Phase.ENCODE,
    UnitKind.DIFFUSION_STEP: "denoise_step",
    UnitKind.VAE_TILE: Phase.DECODE,
    UnitKind.REWARD_BATCH: Phase.REWARD,
}
#: loop id -> the phase its loop span reports under (a whole loop of one request)
LOOP_PHASE = {
    LoopId.TEXT_ENCODE: "encode_loop",
    LoopId.DIFFUSION_DENOISE: "denoise_loop",
    LoopId.VAE_DECODE: "decode_loop",
    LoopId.REWARD_SCORE: "reward_loop",
}
#: report order; phases not listed here follow in name order
PHASE_ORDER = (
    "queue_wait", "admission", "unit_queue_wait", "dispatch",
    Phase.ENCODE, "denoise_step", Phase.DECODE, Phase.REWARD,
    "pool_encode", "pool_denoise_step", "pool_decode", "pool_reward",
    "transfer",
    "encode_loop", "denoise_loop", "decode_loop", "reward_loop",
    "end_to_end",
)
