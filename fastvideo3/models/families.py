"""The built-in model families: importing this module registers each one with
:mod:`fastvideo3.card.family` (the ``fastvideo3`` package imports it). A new built-in family adds
its folder under models/ and one line here; card/, loop/, runtime/ and services/ stay as they are.
"""
from fastvideo3.models.wan import family as wan  # noqa: F401  (registers the Wan family)

__all__ = ["wan"]
