"""Reward scorers: small models (or formulas) that score a generated clip.

Every scorer implements :class:`~fastvideo3.models.reward.scorers.Scorer`; the reward pool
(``services/reward``) hosts them behind the same executor contract as the other pools. The
built-in scorers need no downloaded weights; a learned reward model plugs in as another
``Scorer``.
"""
from fastvideo3.models.reward.scorers import (
    SCORERS, ImageQualityScorer, Scorer, TemporalConsistencyScorer, check_scorer_names, make_scorer,
)

__all__ = ["SCORERS", "ImageQualityScorer", "Scorer", "TemporalConsistencyScorer", "check_scorer_names",
           "make_scorer"]
