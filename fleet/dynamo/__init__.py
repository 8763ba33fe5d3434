"""The fleet's NVIDIA Dynamo worker: registers a fastvideo3 fleet with Dynamo as a video model
and forwards Dynamo's ``/v1/videos`` requests to the fleet's scheduler.

Laid out like Dynamo's own backends: ``main.py`` (the engine and its lifecycle), ``handlers.py``
(request translation, responses, error mapping, cancellation), ``args.py`` (flags and config),
``health_check.py`` (the canary). Run it with ``python -m fleet.dynamo --scheduler HOST:PORT``.
Importing this package does not import Dynamo; ``fleet.dynamo.main`` does.
"""
