#!/usr/bin/env bash
# Installs the Debian bookworm packages Tally needs on a CPU machine. Needs root (or sudo); skips apt
# entirely when everything is already installed.
#   install-deps.sh build   what building and running tally, tallyd and tally-worker need (demo.sh)
#   install-deps.sh test    that, plus what the test suite uses: GoogleTest, clang (fuzzers, thread
#                           safety), the Python references, Chromium, Slurm, podman (test.sh; default)
set -euo pipefail
what=${1:-test}
build_pkgs=(build-essential cmake ninja-build pkg-config
      protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev libabsl-dev libtorch-dev
      libpng-dev libdeflate-dev libturbojpeg0-dev libsqlite3-dev zlib1g-dev libnifti2-dev libsimdjson-dev
      prometheus-cpp-dev libcivetweb-dev libtiff-dev libwebp-dev libdcmtk-dev libarchive-dev libxxhash-dev)
test_pkgs=(libgtest-dev libgmock-dev clang xxhash python3-tifffile python3-pydicom
      python3 python3-numpy python3-scipy python3-pil python3-torch python3-nibabel python3-grpcio python3-protobuf python3-pandas
      openssl chromium systemd python3-yaml yamllint python3-prometheus-client
      dpkg-dev python3-venv python3-pip python3-setuptools python3-wheel python3-selenium chromium-driver
      slurm-wlm munge podman runc netavark aardvark-dns iptables debootstrap)
case "$what" in
  build) pkgs=("${build_pkgs[@]}") ;;
  test) pkgs=("${build_pkgs[@]}" "${test_pkgs[@]}") ;;
  *) echo "usage: install-deps.sh [build|test]" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
echo "install-deps: installing ${#missing[@]} packages"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
