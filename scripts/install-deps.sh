#!/usr/bin/env bash
# Installs the Debian bookworm packages Tally needs to build, test and run on a CPU machine.
# Skips apt entirely when everything is already installed. Needs root (or sudo).
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config
      protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev libabsl-dev
      libtorch-dev libgtest-dev libgmock-dev libpng-dev libdeflate-dev libturbojpeg0-dev libsqlite3-dev zlib1g-dev libnifti2-dev libsimdjson-dev prometheus-cpp-dev libcivetweb-dev clang
      libtiff-dev libwebp-dev libdcmtk-dev libarchive-dev libxxhash-dev xxhash python3-tifffile python3-pydicom
      python3 python3-numpy python3-scipy python3-pil python3-torch python3-nibabel python3-grpcio python3-protobuf python3-pandas
      openssl chromium systemd python3-yaml yamllint python3-prometheus-client
      dpkg-dev python3-venv python3-pip python3-setuptools python3-wheel python3-selenium chromium-driver
      slurm-wlm munge podman runc netavark aardvark-dns iptables debootstrap)
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
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
