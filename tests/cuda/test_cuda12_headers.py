#!/usr/bin/env python3
"""The CUDA backend against CUDA 12's headers, the worker image's default toolkit
(docker/Dockerfile.worker), on a machine whose own toolkit is CUDA 13.

  test_cuda12_headers.py --cuda DIR --build BUILD_DIR

DIR holds CUDA 12.8's headers and libdevice (scripts/fetch-cuda-headers.py; scripts/test.sh
fetches them). No CUDA 12 nvcc is installable here, so:
  * every kernels/cuda/*.cu goes through clang's CUDA front end (host and sm_80 device code,
    -Wall -Wextra -Werror) with DIR as its CUDA installation: every CUDA runtime, cuBLAS and
    device API the kernels use must be declared by 12.8 with the types they are called with;
  * the host files of the CUDA backend (kernels/cuda/*.cc) through g++ with DIR first;
  * probes that must fail: a CUDA 13-only runtime call under each compiler (so the check reads
    12.8's headers, not /usr/local/include's CUDA 13 ones), and one that must pass, naming
    CUDA_VERSION 12080 and cuBLAS 12.
What this cannot check is nvcc 12's own code generation; the image build does that.

Two shims for clang 14 (Debian 12's) with CUDA 12, which clang 14 predates: its texture
intrinsics header uses texture references, which CUDA 12 removed (pre-defining that header's
guard skips it; adjsh uses no textures), and CUDA 12's host_defines.h defines __noinline__ for
clang, which breaks libstdc++'s __attribute__((__noinline__)) (undefined after the runtime
wrapper, before any of our includes; adjsh does not use it).
Prints one line per check; exit 1 when any fails.
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def system_includes(compiler):
    """The compiler's C++ include search list, without /usr/local/include (where this machine
    links CUDA 13's headers)."""
    r = subprocess.run([compiler, "-x", "c++", "-std=c++17", "-E", "-v", "-"], input="",
                       capture_output=True, text=True)
    text = r.stderr.split("#include <...> search starts here:")[1].split("End of search list.")[0]
    return [d.strip() for d in text.splitlines()
            if d.strip() and not d.strip().startswith("/usr/local/include")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuda", required=True, help="CUDA 12.8 headers (fetch-cuda-headers.py)")
    ap.add_argument("--build", required=True, help="the build directory (generated headers)")
    args = ap.parse_args()
    cuda = os.path.abspath(args.cuda)
    if not os.path.isfile(os.path.join(cuda, "include", "cuda_runtime_api.h")):
        print(f"FAIL no CUDA 12 headers in {cuda}: run scripts/fetch-cuda-headers.py")
        return 1

    with tempfile.TemporaryDirectory() as tmp:
        prelude = os.path.join(tmp, "prelude.h")
        with open(prelude, "w") as f:
            f.write("#undef __noinline__\n")
        resource = subprocess.run(["clang++", "-print-resource-dir"], capture_output=True,
                                  text=True).stdout.strip()
        isystem = [os.path.join(resource, "include", "cuda_wrappers")]
        isystem += system_includes("clang++")
        # The CUDA headers after the compiler's own and before /usr/include, as clang orders
        # an installation it finds itself.
        pos = next(i for i, d in enumerate(isystem) if d.startswith("/usr/include/x86_64"))
        isystem.insert(pos, os.path.join(cuda, "include"))
        clang = ["clang++", "-x", "cuda", f"--cuda-path={cuda}", "--cuda-gpu-arch=sm_80",
                 "-nostdinc", *[a for d in isystem for a in ("-isystem", d)],
                 "-include", prelude, "-D__CLANG_CUDA_TEXTURE_INTRINSICS_H__",
                 "-Wno-unknown-cuda-version", "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra",
                 "-Werror", f"-I{ROOT}", f"-I{args.build}"]
        gxx = ["g++", "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
               f"-I{cuda}/include", f"-I{ROOT}", f"-I{args.build}",
               '-DADJSH_CUDA_LIBRARY_DIR="/usr/local/cuda/lib64"']

        def compiles(cmd, path):
            r = subprocess.run([*cmd, path], capture_output=True, text=True)
            lines = [l for l in r.stderr.splitlines() if "error" in l]
            return r.returncode == 0, (lines[0] if lines else r.stderr.strip()[:300])

        # The probes first: they say whose headers the compilers read.
        ok_probe = os.path.join(tmp, "version.cu")
        with open(ok_probe, "w") as f:
            f.write("#include <cuda_runtime.h>\n#include <cublas_v2.h>\n"
                    "static_assert(CUDA_VERSION == 12080, \"CUDA 12.8\");\n"
                    "static_assert(CUBLAS_VER_MAJOR == 12, \"cuBLAS 12\");\n")
        ok, why = compiles(clang, ok_probe)
        check(ok, f"clang reads CUDA 12.8 and cuBLAS 12 ({why or 'CUDA_VERSION 12080'})")
        bad = os.path.join(tmp, "cuda13_only.cu")
        with open(bad, "w") as f:  # cudaLogsCurrent: CUDA 12.9 and later
            f.write("#include <cuda_runtime.h>\n"
                    "int f() { return cudaLogsCurrent(nullptr, 0); }\n")
        for name, cmd, path in (("clang", clang, bad), ("g++", gxx, bad[:-3] + ".cc")):
            if path != bad:
                os.link(bad, path)
            ok, why = compiles(cmd, path)
            check(not ok and "cudaLogsCurrent" in why,
                  f"{name}: a call CUDA 12.8 lacks is refused ({why or 'it compiled'})")

        dev = os.path.join(tmp, "device.cu")
        with open(dev, "w") as f:  # device code is compiled too, not the host side only
            f.write("int host_only() { return 1; }\n"
                    "__global__ void k(int* p) { *p = host_only(); }\n")
        ok, why = compiles(clang, dev)
        check(not ok and "host_only" in why,
              f"clang: a kernel calling a host function is refused ({why or 'it compiled'})")

        # The kernels through clang (host and device), the host files through g++.
        for ext, cmd, least, what in ((".cu", clang, 5, "host and sm_80 device code"),
                                      (".cc", gxx, 2, "g++")):
            paths = sorted(glob.glob(os.path.join(ROOT, "kernels", "cuda", "*" + ext)))
            check(len(paths) >= least, f"{len(paths)} {ext} files in kernels/cuda")
            for path in paths:
                ok, why = compiles(cmd, path)
                check(ok, f"{os.path.relpath(path, ROOT)}: {what} against CUDA 12.8"
                          f"{': ' + why if why else ''}")

    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
