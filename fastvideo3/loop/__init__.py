"""Driven loops: the Loop protocol, typed LoopStates, the one driver, and the loops."""
from fastvideo3.loop.context import RequestContext
from fastvideo3.loop.decode import DecodeLoop, DecodeState
from fastvideo3.loop.denoise import DenoiseLoop, DenoiseState
from fastvideo3.loop.driver import LoopDriver, run_loop
from fastvideo3.loop.protocol import Done, Loop, LoopResult, LoopState, Resources, StepResult, WorkPlan
from fastvideo3.loop.reward_score import RewardScoreLoop, RewardScoreState
from fastvideo3.loop.text_encode import TextEncodeLoop, TextEncodeState
from fastvideo3.vocab import LoopId

LOOPS = {LoopId.TEXT_ENCODE: TextEncodeLoop, LoopId.DIFFUSION_DENOISE: DenoiseLoop, LoopId.VAE_DECODE: DecodeLoop,
         LoopId.REWARD_SCORE: RewardScoreLoop}
STATES = {LoopId.TEXT_ENCODE: TextEncodeState, LoopId.DIFFUSION_DENOISE: DenoiseState, LoopId.VAE_DECODE: DecodeState,
          LoopId.REWARD_SCORE: RewardScoreState}

__all__ = [
    "DecodeLoop", "DecodeState", "DenoiseLoop", "DenoiseState", "Done", "LOOPS", "Loop", "LoopDriver",
    "LoopResult", "LoopState", "RequestContext", "Resources", "RewardScoreLoop", "RewardScoreState", "STATES", "StepResult",
    "TextEncodeLoop", "TextEncodeState", "WorkPlan", "run_loop",
]
