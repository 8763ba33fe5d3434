"""Test-only builders: random-weight checkpoints in the diffusers layout (Wan2.1 T2V and the layouts
next to it; HunyuanVideo-1.5 T2V: synthetic_hunyuan15.py), written offline by diffusers' and
transformers' own classes.

Tests and benchmarks import this package; serving code (the rest of ``fastvideo3``, ``services``,
``fleet``) never does (tests/unit/test_testing_imports.py checks it). The built-in tiny cards need
none of it: their weights are shipped (``fastvideo3/weights``) or drawn at load time from a seeded
generator (``fastvideo3.models.wan.components``).
"""
