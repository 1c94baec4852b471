"""edged's gRPC API: edge/v1/edge.proto, the modules generated from it, server.py
(edged's side), client.py (edgectl's side) and convert.py (status dicts <-> messages).

edge_pb2 and edge_pb2_grpc are generated from the proto on first import (_gen.py)
into a git-ignored directory; they are never edited by hand or committed.
"""

from controlplane.api._gen import load as _load

edge_pb2, edge_pb2_grpc = _load()

__all__ = ["edge_pb2", "edge_pb2_grpc"]
