"""The reward role pool: scorers for generated clips (``python -m services.reward``)."""
