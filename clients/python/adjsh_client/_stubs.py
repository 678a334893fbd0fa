"""The generated gRPC modules of proto/adjsh.proto (adjsh_pb2, adjsh_pb2_grpc), made with
grpc_tools.protoc into adjsh_client/_generated/ when missing or older than the proto."""
import importlib
import os
import sys
import threading

_HERE = os.path.dirname(os.path.abspath(__file__))
_GEN = os.path.join(_HERE, "_generated")
# The proto of the repository this package lives in (clients/python/adjsh_client -> root), or
# $ADJSH_PROTO (an installed client).
_PROTO = os.environ.get("ADJSH_PROTO") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(_HERE))), "proto", "adjsh.proto")
_lock = threading.Lock()


def _stale():
    out = os.path.join(_GEN, "proto", "adjsh_pb2.py")
    return not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(_PROTO)


def generate():
    """Runs protoc (grpc_tools) on proto/adjsh.proto; raises RuntimeError with its message."""
    from grpc_tools import protoc
    import grpc_tools

    os.makedirs(os.path.join(_GEN, "proto"), exist_ok=True)
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")  # well-known types
    root = os.path.dirname(os.path.dirname(_PROTO))
    rc = protoc.main(["protoc", f"-I{root}", f"-I{include}", f"--python_out={_GEN}",
                      f"--grpc_python_out={_GEN}", os.path.relpath(_PROTO, root)])
    if rc != 0:
        raise RuntimeError(f"protoc failed ({rc}) on {_PROTO}")


def load():
    """(adjsh_pb2, adjsh_pb2_grpc), generating them first if needed."""
    with _lock:
        if not os.path.exists(_PROTO) and not os.path.exists(os.path.join(_GEN, "proto")):
            raise RuntimeError(f"no proto/adjsh.proto at {_PROTO} (set ADJSH_PROTO)")
        if os.path.exists(_PROTO) and _stale():
            generate()
        if _GEN not in sys.path:
            sys.path.insert(0, _GEN)
        return (importlib.import_module("proto.adjsh_pb2"),
                importlib.import_module("proto.adjsh_pb2_grpc"))
