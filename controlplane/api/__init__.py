"""edged's gRPC API: edge/v1/edge.proto, the modules generated from it
(edge_pb2.py, edge_pb2_grpc.py: committed, never edited by hand; _gen.py makes
them), server.py (edged's side), client.py (edgectl's side) and convert.py
(status dicts <-> messages).
"""
