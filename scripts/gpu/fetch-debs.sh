#!/usr/bin/env bash
# Download the Debian packages that a GPU box with pip-installed PyTorch but no apt access
# needs to build this project (gRPC, Protobuf, Abseil, image codecs incl. TIFF, WebP and DCMTK,
# SQLite, simdjson, libarchive for tar shards), into DIR.
# Usage: fetch-debs.sh DIR [EXTRA_PACKAGE ...]
set -euo pipefail
dir=${1:?usage: fetch-debs.sh DIR [EXTRA_PACKAGE ...]}; shift || true
mkdir -p "$dir"; dir=$(cd "$dir" && pwd); cd "$dir"
pkgs=(libabsl-dev libabsl20220623 libc-ares-dev libc-ares2 libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29
      libprotobuf-dev libprotobuf-lite32 libprotobuf32 libprotoc32 libre2-9 libre2-dev protobuf-compiler
      protobuf-compiler-grpc libpng-dev libpng16-16 libturbojpeg0-dev libturbojpeg0 libjpeg62-turbo
      libjpeg62-turbo-dev libsqlite3-dev libsqlite3-0 libgtest-dev libgmock-dev googletest zlib1g-dev libdeflate-dev libdeflate0
      libnifti2-dev libniftiio-dev libznz-dev libnifti2-2 libniftiio2 libznz3 libsimdjson-dev libsimdjson14
      prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libcivetweb1 libcivetweb-dev
      libtiff-dev libtiff6 libjbig0 liblerc4 libwebp-dev libwebp7 libwebpdemux2 libwebpmux3
      libdcmtk-dev libdcmtk17 libwrap0 libxml2 libicu72
      libarchive-dev libarchive13 libnettle8 liblz4-1 libzstd1 libacl1 liblzma5 libbz2-1.0 libxxhash-dev libxxhash0 "$@")
apt-get -qq download "${pkgs[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true
ls -1 "$dir"/*.deb | wc -l
