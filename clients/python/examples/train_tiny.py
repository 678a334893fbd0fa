#!/usr/bin/env python3
"""Submits a tiny training job to a coordinator and follows it to the end.

    .venv/bin/python clients/python/examples/train_tiny.py --coordinator 127.0.0.1:50051
    (TLS: --ca ca.pem and $ADJSH_AUTH_TOKEN; --server-name adjsh-coordinator through a
    port-forward)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from adjsh_client import Client  # noqa: E402


def show(event):
    """One line per event: a step's progress (with the checkpoint it wrote, if any), or a note:
    a state change, the job waiting for workers."""
    note = event.get("message", "")
    if "profile" in event:  # a step's event
        print(f"  step {event.get('step', 0)} loss {event.get('loss', 0):.4f} "
              f"{event.get('tokens_per_s', 0):.0f} tokens/s{' | ' + note if note else ''}")
    else:
        print(f"  {event.get('state', '')}{': ' + note if note else ''}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--coordinator", default="127.0.0.1:50051")
    ap.add_argument("--ca")
    ap.add_argument("--server-name")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--checkpoint-dir", default="", help="on the coordinator (default: its own)")
    a = ap.parse_args()
    spec = {"init": {"hidden_size": 32, "layers": 2, "vocab_size": 256, "state_size": 8},
            "context_length": 2048, "chunk": 256, "steps": a.steps}
    if a.checkpoint_dir:
        spec["checkpoint_dir"] = a.checkpoint_dir
    with Client(a.coordinator, ca=a.ca, server_name=a.server_name) as c:
        job = c.submit(spec)
        print(f"submitted {job}")
        print(f"workers connected: {c.workers()['connected']}")
        final = c.watch(job, on_event=show)
        print(f"{job}: {final['state']}, loss {final.get('loss', 0):.4f}, "
              f"checkpoint {final.get('last_checkpoint', '')}")


if __name__ == "__main__":
    main()
