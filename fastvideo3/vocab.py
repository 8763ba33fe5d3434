"""The shared vocabulary: the names every layer of the tree speaks.

Roles, unit kinds, loop ids, programs, run statuses, event kinds, output formats and samplers are
written here once and imported everywhere else. Each is a :class:`enum.StrEnum`, so a member
*is* its string: it compares equal to it, hashes like it, formats as it and goes over JSON and
protobuf string fields unchanged. The wire and the stored JSON therefore keep the same bytes;
only the source stops retyping them (a test fails when one of these literals appears outside this
module).

Plain strings still arrive from the wire and from users; ``Role(value)`` (and the like) is the
check that one names a known member.
"""

from __future__ import annotations

from enum import StrEnum


class Name(StrEnum):
    """A vocabulary member. Its ``repr`` is its string's, so messages that quote a value with
    ``!r`` (and pydantic's validation errors) read the same whichever form they were given."""

    def __repr__(self) -> str:
        return repr(self.value)


def _vocab(name: str, doc: str, **members: str) -> type[Name]:
    """The :class:`Name` enum ``name`` whose members are ``members`` (member name -> its string)."""
    made = Name(name, members, module=__name__, qualname=name)
    made.__doc__ = doc
    return made


Role = _vocab("Role", "A pool role: one kind of GPU service the scheduler sends WorkUnits to.",
              ENCODER="encoder", DENOISER="denoiser", DECODER="decoder", REWARD="reward")
UnitKind = _vocab("UnitKind", "What one WorkUnit asks a pool to do. ``VAE_ENCODE`` is the decoder pool's second "
                  "kind: the VAE's encoder over an image-to-video request's first frame (the image latent the "
                  "denoiser conditions on).",
                  ENCODER_CHUNK="encoder_chunk", DIFFUSION_STEP="diffusion_step", VAE_TILE="vae_tile",
                  REWARD_BATCH="reward_batch", VAE_ENCODE="vae_encode")
LoopId = _vocab("LoopId", "The loops a program chains (fastvideo3.loop).",
                TEXT_ENCODE="text_encode", DIFFUSION_DENOISE="diffusion_denoise", VAE_DECODE="vae_decode",
                REWARD_SCORE="reward_score")
Program = _vocab("Program", "A named chain of loops a request runs.", T2V="t2v", T2V_REWARD="t2v+reward")
RunStatus = _vocab("RunStatus", "Where a request's run stands in the scheduler.",
                   QUEUED="QUEUED", RUNNING="RUNNING", SUCCEEDED="SUCCEEDED", FAILED="FAILED", CANCELLED="CANCELLED")
EventKind = _vocab("EventKind", "The kinds of event a request's stream carries. ``RESUMED``: the request goes on "
                   "from a checkpoint after a failure; ``MOVED``: the serving scheduler replica handed its "
                   "requests over.",
                   ACCEPTED="accepted", QUEUED="queued", PROGRESS="progress", ARTIFACT="artifact", ERROR="error",
                   FINISHED="finished", RESUMED="resumed", MOVED="moved")
Task = _vocab("Task", "A task a card declares it can serve (``ModelCard.capabilities.tasks``).",
              TEXT_TO_VIDEO="text_to_video", IMAGE_TO_VIDEO="image_to_video", VAE_DECODE="vae_decode",
              REWARD="reward")
Phase = _vocab("Phase", "A phase of a request as progress and spans name it.",
               ENCODE="encode", DENOISE="denoise", DECODE="decode", REWARD="reward")
OutputFormat = _vocab("OutputFormat", "How the decoder pool returns the finished video.", MP4="mp4", NPY="npy")
Sampler = _vocab("Sampler", "The sampler (flow-matching scheduler) a denoise loop steps with.",
                 UNIPC="unipc", EULER="euler")


#: the unit kind each role's pool is named for (its main kind)
KIND_OF_ROLE: dict[Role, UnitKind] = {
    Role.ENCODER: UnitKind.ENCODER_CHUNK, Role.DENOISER: UnitKind.DIFFUSION_STEP,
    Role.DECODER: UnitKind.VAE_TILE, Role.REWARD: UnitKind.REWARD_BATCH,
}
#: the role whose pool runs each unit kind
ROLE_OF_KIND: dict[UnitKind, Role] = {**{kind: role for role, kind in KIND_OF_ROLE.items()},
                                      UnitKind.VAE_ENCODE: Role.DECODER}
#: every unit kind each role's pool runs
KINDS_OF_ROLE: dict[Role, tuple[UnitKind, ...]] = {
    role: tuple(k for k, r in ROLE_OF_KIND.items() if r == role) for role in KIND_OF_ROLE}
#: the loops of each program, in order
PROGRAM_LOOPS: dict[Program, tuple[LoopId, ...]] = {
    Program.T2V: (LoopId.TEXT_ENCODE, LoopId.DIFFUSION_DENOISE, LoopId.VAE_DECODE),
    Program.T2V_REWARD: (LoopId.TEXT_ENCODE, LoopId.DIFFUSION_DENOISE, LoopId.VAE_DECODE, LoopId.REWARD_SCORE),
}
#: statuses a run never leaves
TERMINAL_STATUSES: tuple[RunStatus, ...] = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
#: the four pool roles, in pipeline order
ROLES: tuple[Role, ...] = tuple(Role)
UNIT_KINDS: tuple[UnitKind, ...] = tuple(UnitKind)
OUTPUT_FORMATS: tuple[OutputFormat, ...] = tuple(OutputFormat)
SAMPLERS: tuple[Sampler, ...] = tuple(Sampler)

__all__ = [
    "KIND_OF_ROLE", "KINDS_OF_ROLE", "OUTPUT_FORMATS", "PROGRAM_LOOPS", "ROLES", "ROLE_OF_KIND", "SAMPLERS", "TERMINAL_STATUSES",
    "UNIT_KINDS", "EventKind", "LoopId", "Name", "OutputFormat", "Phase", "Program", "Role", "RunStatus", "Sampler", "Task",
    "UnitKind",
]
