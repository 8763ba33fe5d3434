"""The built-in model families: importing this module registers each one with
:mod:`fastvideo3.card.family` (the ``fastvideo3`` package imports it). A new built-in family adds
its folder under models/ and one line here; card/, loop/, runtime/ and services/ stay as they are.
"""
from fastvideo3.models.wan import family as wan  # noqa: F401  (registers the Wan family)
from fastvideo3.models.hunyuan15 import family as hunyuan15  # noqa: F401  (registers HunyuanVideo-1.5)

__all__ = ["hunyuan15", "wan"]
