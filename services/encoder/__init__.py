"""The encoder role pool: text encoders behind the RolePool contract (``python -m services.encoder``)."""
