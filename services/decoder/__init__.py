"""The decoder role pool: the VAE, which also encodes the output file (``python -m services.decoder``)."""
