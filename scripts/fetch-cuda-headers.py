#!/usr/bin/env python3
"""Fetches the headers of one CUDA 12 release from NVIDIA's PyPI wheels, for
tests/cuda/test_cuda12_headers.py: the worker image builds against CUDA 12 by default
(docker/Dockerfile.worker), while this machine's toolkit is CUDA 13, so the check that the
CUDA backend still compiles against 12 needs 12's headers.

  scripts/fetch-cuda-headers.py [--dest DIR]      (default .venv/cuda-12.8, made by setup)

Only the headers (and libdevice, which clang's CUDA front end needs to accept an installation)
are read out of each wheel, by HTTP range requests: the cuBLAS wheel is about 600 MB, its
headers under 1 MB. Each member is checked against its CRC-32 in the wheel's directory.
Idempotent: when DIR/.stamp names these wheels nothing is fetched and nothing is printed.
Exit 1 with the reason when a wheel cannot be found or read.
"""
import argparse
import io
import os
import re
import shutil
import sys
import urllib.request
import zipfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
INDEX = "https://pypi.org/simple"
# (distribution, version, [(member prefix in the wheel, destination under DIR)]).
WHEELS = [
    ("nvidia-cuda-runtime-cu12", "12.8.90", [("nvidia/cuda_runtime/include/", "include/")]),
    ("nvidia-cuda-nvcc-cu12", "12.8.93", [("nvidia/cuda_nvcc/include/", "include/"),
                                          ("nvidia/cuda_nvcc/nvvm/libdevice/",
                                           "nvvm/libdevice/")]),
    ("nvidia-cuda-cccl-cu12", "12.8.90", [("nvidia/cuda_cccl/include/", "include/")]),
    ("nvidia-cublas-cu12", "12.8.5.5", [("nvidia/cublas/include/", "include/")]),
    # clang's CUDA runtime wrapper includes curand_mtgp32_kernel.h.
    ("nvidia-curand-cu12", "10.3.9.90", [("nvidia/curand/include/", "include/")]),
]
BLOCK = 1 << 18


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file through HTTP range requests (blocks cached),
    enough for zipfile to read a directory and chosen members only."""

    def __init__(self, url, size):
        self.url, self.size, self.pos, self.blocks, self.fetched = url, size, 0, {}, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self.pos

    def seek(self, offset, whence=0):
        self.pos = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        return self.pos

    def _block(self, i):
        if i not in self.blocks:
            lo, hi = i * BLOCK, min(self.size, (i + 1) * BLOCK) - 1
            req = urllib.request.Request(self.url, headers={"Range": f"bytes={lo}-{hi}"})
            with urllib.request.urlopen(req, timeout=60) as r:
                data = r.read()
            if r.status != 206 or len(data) != hi - lo + 1:
                raise OSError(f"{self.url}: range {lo}-{hi} answered {r.status}, {len(data)} B")
            self.blocks[i] = data
            self.fetched += len(data)
        return self.blocks[i]

    def readinto(self, b):
        n = min(len(b), max(0, self.size - self.pos))
        done = 0
        while done < n:
            i, off = divmod(self.pos + done, BLOCK)
            chunk = self._block(i)[off:off + n - done]
            b[done:done + len(chunk)] = chunk
            done += len(chunk)
        self.pos += n
        return n


def wheel_url(dist, version):
    """The x86_64 Linux wheel of dist==version on the index: (url, size)."""
    with urllib.request.urlopen(f"{INDEX}/{dist}/", timeout=60) as r:
        html = r.read().decode()
    stem = dist.replace("-", "_") + "-" + re.escape(version) + "-"
    links = [u.split("#")[0] for u in re.findall(r'href="([^"]+)"', html)
             if re.search(stem + r"[^/]*x86_64[^/]*\.whl", u.split("#")[0])]
    if not links:
        raise OSError(f"no x86_64 wheel of {dist}=={version} on {INDEX}")
    head = urllib.request.Request(links[0], method="HEAD")
    with urllib.request.urlopen(head, timeout=60) as r:
        return links[0], int(r.headers["Content-Length"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dest", default=os.path.join(ROOT, ".venv", "cuda-12.8"),
                    help="where include/ and nvvm/ go (default: .venv/cuda-12.8)")
    args = ap.parse_args()
    stamp_text = "\n".join(f"{d}=={v}" for d, v, _ in WHEELS) + "\nlayout 2\n"
    stamp = os.path.join(args.dest, ".stamp")
    if os.path.isfile(stamp) and open(stamp).read() == stamp_text:
        return 0
    tmp = args.dest + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    total = 0
    try:
        for dist, version, parts in WHEELS:
            url, size = wheel_url(dist, version)
            f = RangeFile(url, size)
            with zipfile.ZipFile(io.BufferedReader(f, BLOCK)) as z:
                for info in z.infolist():
                    for prefix, to in parts:
                        if info.filename.startswith(prefix) and not info.is_dir() and \
                                not info.filename.endswith("__init__.py"):
                            out = os.path.join(tmp, to, info.filename[len(prefix):])
                            os.makedirs(os.path.dirname(out), exist_ok=True)
                            with z.open(info) as src, open(out, "wb") as dst:  # CRC checked
                                shutil.copyfileobj(src, dst)
            total += f.fetched
            print(f"fetch-cuda-headers: {dist}=={version}: {f.fetched / 2**20:.1f} MiB of "
                  f"{size / 2**20:.0f}", file=sys.stderr)
    except (OSError, zipfile.BadZipFile) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"fetch-cuda-headers: {e}", file=sys.stderr)
        return 1
    # clang accepts a CUDA installation with bin/, lib64/ and nvvm/libdevice; nothing in them
    # but libdevice is read.
    for d in ("bin", "lib64"):
        os.makedirs(os.path.join(tmp, d), exist_ok=True)
    with open(os.path.join(tmp, ".stamp"), "w") as s:
        s.write(stamp_text)
    shutil.rmtree(args.dest, ignore_errors=True)
    os.replace(tmp, args.dest)
    print(f"fetch-cuda-headers: ready: {args.dest} ({total / 2**20:.1f} MiB fetched)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
