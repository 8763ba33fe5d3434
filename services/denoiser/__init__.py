"""The denoiser role pool: the DiT, with each request's latent and sampler history resident
(``python -m services.denoiser``)."""
