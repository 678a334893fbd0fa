"""A thin Python client of an adjsh coordinator's JobService (proto/adjsh.proto).

    from adjsh_client import Client
    c = Client("127.0.0.1:50051")                       # a --insecure-local coordinator
    c = Client("coordinator:50051", ca="ca.pem", token="...", server_name="adjsh-coordinator")
    job = c.submit({"init": {"hidden_size": 64, "layers": 2, "vocab_size": 256},
                    "context_length": 4096, "steps": 10})
    final = c.watch(job, on_event=lambda e: print(e["step"], e["loss"]))
    c.status(job)["state"], c.jobs(), c.cancel(job)

Specs, jobs and events are dicts in protobuf's JSON mapping of proto/adjsh.proto (field names as
in the proto, e.g. "context_length"), the same JSON that `adjsh submit --spec` reads. The gRPC
stubs are generated from proto/adjsh.proto with grpc_tools on first use (adjsh_client/_stubs.py),
into adjsh_client/_generated/, and again whenever the proto is newer. Needs grpcio,
grpcio-tools and protobuf (the project venv of scripts/setup-venv.sh has them).
"""
from adjsh_client._client import Client, JobFailed  # noqa: F401

__all__ = ["Client", "JobFailed"]
