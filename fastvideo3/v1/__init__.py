"""Generated Python modules of the wire contracts (protobuf package ``fastvideo3.v1``).

Sources live in ``protos/fastvideo3/v1/*.proto``. The ``*_pb2.py``, ``*_pb2.pyi`` and
``*_pb2_grpc.py`` files here are generated and committed; do not edit them. Regenerate with
``python protos/generate.py``; ``python protos/generate.py --check`` (and
``tests/unit/test_protos.py``) fail when they are stale.
"""
