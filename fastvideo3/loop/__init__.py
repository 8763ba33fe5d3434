"""Driven loops: the Loop protocol, typed LoopStates, the one driver, and the loops."""
from fastvideo3.loop.decode import DecodeLoop, DecodeState
from fastvideo3.loop.denoise import DenoiseLoop, DenoiseState
from fastvideo3.loop.driver import LoopDriver, run_loop
from fastvideo3.loop.protocol import Done, Loop, LoopResult, LoopState, Resources, StepResult, WorkPlan
from fastvideo3.loop.reward_score import RewardScoreLoop, RewardScoreState
from fastvideo3.loop.text_encode import TextEncodeLoop, TextEncodeState

LOOPS = {"text_encode": TextEncodeLoop, "diffusion_denoise": DenoiseLoop, "vae_decode": DecodeLoop,
         "reward_score": RewardScoreLoop}
STATES = {"text_encode": TextEncodeState, "diffusion_denoise": DenoiseState, "vae_decode": DecodeState,
          "reward_score": RewardScoreState}

__all__ = [
    "DecodeLoop", "DecodeState", "DenoiseLoop", "DenoiseState", "Done", "LOOPS", "Loop", "LoopDriver",
    "LoopResult", "LoopState", "Resources", "RewardScoreLoop", "RewardScoreState", "STATES", "StepResult",
    "TextEncodeLoop", "TextEncodeState", "WorkPlan", "run_loop",
]
