# Tally in a container (CPU image; the GPU variant is described at the end and in README
# "Deployment"). Two stages: the build is the README's own (scripts/install-deps.sh, then
# scripts/build.sh, on Debian bookworm), the runtime image holds the binaries, the Python package
# and the shared libraries they link (tests/integration/test_deploy.py keeps that list true).
#
#   docker build -t tally .
#   docker run -d --name tallyd -p 50051:50051 -p 9464:9464 -v tally-state:/var/lib/tally tally \
#       tallyd --listen 0.0.0.0:50051 --metrics-listen 0.0.0.0:9464 --state-dir /var/lib/tally --data-root /datasets ...
#   docker run -d -v /datasets:/datasets:ro tally tally-worker --coordinator tallyd:50051 --device cpu
#
# Both run as the unprivileged user `tally` (uid 10001); mount state and data so that it may read
# (and, for --state-dir and --save-predictions, write) them.

FROM debian:bookworm AS build
COPY . /src
RUN /src/scripts/install-deps.sh \
 && TALLY_CMAKE_ARGS="-DTALLY_BUILD_TESTS=OFF -DCMAKE_INSTALL_PREFIX=/opt/tally" /src/scripts/build.sh /build \
 && cmake --install /build

FROM debian:bookworm-slim AS runtime
# The libraries the binaries link (NEEDED entries), by package, and python3 + numpy for the Python
# model backend's stub (add torch and your model's packages in an image built on this one).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libabsl20220623 libgrpc29 libgrpc++1.51 libprotobuf32 libtorch1.13 libpng16-16 libdeflate0 \
      libturbojpeg0 libsqlite3-0 zlib1g libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libcivetweb1 libsimdjson14 \
      libtiff6 libwebp7 libdcmtk17 libarchive13 \
      ca-certificates python3 python3-numpy \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/tally --create-home tally
COPY --from=build /opt/tally /opt/tally
ENV PATH=/opt/tally/bin:$PATH
USER tally
WORKDIR /var/lib/tally
EXPOSE 50051 9464
CMD ["tallyd", "--listen", "0.0.0.0:50051", "--state-dir", "/var/lib/tally"]

# GPU variant (not built here: it needs NVIDIA's CUDA and a CUDA LibTorch): build on a host or
# image with the CUDA 12/13 toolkit and `pip install torch` (its LibTorch, headers and CMake config
# included), as scripts/gpu/build.sh does on the GPU box: gRPC, Protobuf and Abseil from Debian,
#   cmake -S . -B build-gpu -G Ninja -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
# then copy build-gpu/bin and python/ into a runtime image with the CUDA runtime and that torch
# wheel, and run it with `--gpus all` (NVIDIA Container Toolkit); workers then take --device cuda:0.
