#!/usr/bin/env bash
# Installs the Debian packages adjsh needs to build, test and run. Idempotent: a package already
# installed is not touched, and apt is not called at all when nothing is missing.
#   scripts/install-deps.sh                    everything (build and tests: docker.io,
#                                              docker-compose and debootstrap build and run
#                                              the images and the compose stack, iproute2
#                                              makes the hosts of tests/net/)
#   ADJSH_DEPS=build scripts/install-deps.sh   what configuring and building needs, without the
#                                              Python test packages (the container images build
#                                              so; scripts/build.sh passes the variable on)
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev
  libabsl-dev libprotobuf-dev protobuf-compiler libgrpc++-dev protobuf-compiler-grpc
  prometheus-cpp-dev libssl-dev
)
case "${ADJSH_DEPS:-all}" in
  build) ;;
  all) PACKAGES+=(python3 python3-numpy python3-torch python3-matplotlib python3-yaml
                  docker-compose docker.io debootstrap prometheus iproute2
                  openssl clang libclang-rt-14-dev) ;;
  *) echo "install-deps: ADJSH_DEPS must be 'all' or 'build', got '${ADJSH_DEPS}'" >&2; exit 2 ;;
esac

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root (or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
