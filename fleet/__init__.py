"""Fleet-level tooling: the local multi-process launcher (``fastvideo3 serve``), DeploymentCard /
cost-model export and the Dynamo worker adapter. Submodules import lazily."""

__all__ = ["FleetError", "LocalFleet", "free_port"]


def __getattr__(name: str):
    if name in __all__:
        from fleet import launcher
        return getattr(launcher, name)
    raise AttributeError(name)
