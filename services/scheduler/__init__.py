"""The scheduler service: the fleet's front door (``python -m services.scheduler``).

It owns every request's loops through the core :class:`~fastvideo3.runtime.scheduling.scheduler.CoreScheduler`
— the same class the embedded engine uses — driven by a background tick thread, with one
:class:`~services.scheduler.remote.RemoteExecutor` per pool replica in place of in-process
executors. Tensors never pass through it: WorkUnits carry TensorRefs and pools move bytes to
each other through the transport chosen per edge.
"""
