"""Client: submit, watch, status, jobs, cancel over gRPC (plaintext to loopback, or TLS with a
bearer token), with adjsh's error messages."""
import grpc
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor

from adjsh_client import _stubs

_TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


class JobFailed(RuntimeError):
    """watch(..., check=True) of a job that ended FAILED or CANCELLED: .job is its last state."""

    def __init__(self, job):
        super().__init__(f"job {job.get('job_id')} ended {job.get('state')}: "
                         f"{job.get('error', '')}")
        self.job = job


_INT64 = {FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64}


def _ints(msg, d):
    """64-bit integers as Python ints (protobuf's JSON mapping writes them as strings)."""
    for field, value in msg.ListFields():
        if field.name not in d:
            continue
        repeated = field.label == FieldDescriptor.LABEL_REPEATED
        if field.type in _INT64:
            d[field.name] = [int(v) for v in value] if repeated else int(value)
        elif (field.type == FieldDescriptor.TYPE_MESSAGE and
              not field.message_type.full_name.startswith("google.protobuf.")):
            if repeated:
                for m, sub in zip(value, d[field.name]):
                    _ints(m, sub)
            else:
                _ints(value, d[field.name])
    return d


def _dict(msg):
    """A message as a dict: proto field names, enums by name, 64-bit integers as ints."""
    return _ints(msg, json_format.MessageToDict(msg, preserving_proto_field_name=True))


class Client:
    """address: HOST:PORT of the coordinator. ca: PEM file of the CA that signed its certificate
    (TLS; without it, plaintext to a --insecure-local coordinator on loopback). token: the job
    API's bearer token (TLS only; default $ADJSH_AUTH_TOKEN). server_name: the name its
    certificate carries when it differs from the address's host (a port-forward). timeout:
    seconds per unary call."""

    def __init__(self, address, ca=None, token=None, server_name=None, timeout=30.0):
        import os
        self._pb, grpc_mod = _stubs.load()
        self._timeout = timeout
        token = token if token is not None else os.environ.get("ADJSH_AUTH_TOKEN")
        if ca is None:
            if token:
                raise ValueError("a token goes over TLS only: give ca=")
            self._channel = grpc.insecure_channel(address)
        else:
            with open(ca, "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            if token:
                creds = grpc.composite_channel_credentials(
                    creds, grpc.access_token_call_credentials(token.strip()))
            options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
            self._channel = grpc.secure_channel(address, creds, options=options)
        self._stub = grpc_mod.JobServiceStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def submit(self, spec):
        """Submits a JobSpec (a dict, or its JSON text); returns the job id."""
        msg = self._pb.JobSpec()
        if isinstance(spec, str):
            json_format.Parse(spec, msg)
        else:
            json_format.ParseDict(spec, msg)
        return self._stub.SubmitJob(msg, timeout=self._timeout).job_id

    def status(self, job_id):
        """The job as a dict (job_id, spec, state, step, loss, tokens_per_s, error, ...)."""
        return _dict(self._stub.GetJob(self._pb.GetJobRequest(job_id=job_id),
                                       timeout=self._timeout))

    def jobs(self, states=()):
        """Every job (newest first), optionally only in the given states ("RUNNING", ...)."""
        out, token = [], ""
        while True:
            req = self._pb.ListJobsRequest(page_token=token, states=[
                self._pb.Job.State.Value(s) for s in states])
            resp = self._stub.ListJobs(req, timeout=self._timeout)
            out += [_dict(j) for j in resp.jobs]
            token = resp.next_page_token
            if not token:
                return out

    def workers(self):
        """The coordinator's workers now: {"connected": heard from within a lease,
        "taking_tasks": those of them not shunned for non-finite results}."""
        resp = self._stub.ListJobs(self._pb.ListJobsRequest(page_size=1), timeout=self._timeout)
        return {"connected": resp.workers_connected, "taking_tasks": resp.workers_taking_tasks}

    def cancel(self, job_id):
        """Cancels a queued or running job; returns its state."""
        return _dict(self._stub.CancelJob(self._pb.CancelJobRequest(job_id=job_id),
                                          timeout=self._timeout))

    def watch(self, job_id, on_event=None, check=True, timeout=None):
        """Follows the job's events (on_event(event dict) for each: step, loss, tokens_per_s,
        eta_seconds, state, message) until it ends; returns its final state (status()). With
        check, a FAILED or CANCELLED job raises JobFailed."""
        for event in self._stub.WatchJob(self._pb.WatchJobRequest(job_id=job_id),
                                         timeout=timeout):
            e = _dict(event)
            if on_event:
                on_event(e)
            if e.get("state") in _TERMINAL:
                break
        job = self.status(job_id)
        if check and job.get("state") != "SUCCEEDED":
            raise JobFailed(job)
        return job
