"""Parity tooling: record and compare named taps against a reference implementation."""
from fastvideo3.parity.aligner import Divergence, ParityAligner, hook_reference_blocks, rel_error

__all__ = ["Divergence", "ParityAligner", "hook_reference_blocks", "rel_error"]
