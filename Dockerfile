# Tally in a container (CPU image; the GPU variant is described at the end and in docs/deployment.md).
# Stages: the build is the README's own (scripts/install-deps.sh, then
# scripts/build.sh, on Debian bookworm), the runtime image holds the binaries, the Python package
# and the shared libraries they link (tests/integration/test_deploy.py keeps that list true).
#
#   docker build -t tally .            # or: podman build --format docker -t tally .
#   docker run -d --name tallyd -p 50051:50051 -p 9464:9464 -v tally-state:/var/lib/tally tally \
#       tallyd --listen 0.0.0.0:50051 --metrics-listen 0.0.0.0:9464 --state-dir /var/lib/tally --data-root /datasets ...
#   docker run -d -v /datasets:/datasets:ro tally tally-worker --coordinator tallyd:50051 --device cpu
#
# Both run as the unprivileged user `tally` (uid 10001) and need no writable root file system
# (`--read-only`, as the Kubernetes manifests run them); mount state and data so that it may read
# (and, for --state-dir and --save-predictions, write) them. The health check asks tallyd's gRPC
# health service, as the manifests' grpc probes do.
#
# Binaries already built on a bookworm host (what tests/integration/test_containers.py does, in
# minutes instead of a compile inside the image):
#   cmake --install build --strip --prefix .prebuilt/opt/tally
#   podman build --format docker --build-arg TALLY_BINARIES=prebuilt -t tally .
ARG TALLY_BINARIES=build

FROM debian:bookworm AS build
COPY . /src
RUN /src/scripts/install-deps.sh build \
 && TALLY_CMAKE_ARGS="-DTALLY_BUILD_TESTS=OFF -DCMAKE_INSTALL_PREFIX=/opt/tally" /src/scripts/build.sh /build \
 && cmake --install /build --strip

# The host's build (see above); the Dockerfile alone is copied when there is none, so that builders
# that run every stage still pass.
FROM scratch AS prebuilt
COPY Dockerfile .prebuil[t] /

FROM ${TALLY_BINARIES} AS binaries

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
 && groupadd --system --gid 10001 tally \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/tally --create-home tally
COPY --from=binaries /opt/tally /opt/tally
ENV PATH=/opt/tally/bin:$PATH
# malloc's large areas on transparent huge pages (as `tally run` gives its own processes; docs/how-it-works.md).
ENV GLIBC_TUNABLES=glibc.malloc.hugetlb=1
USER tally
WORKDIR /var/lib/tally
EXPOSE 50051 9464
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 CMD ["tally", "health", "--server", "127.0.0.1:50051"]
CMD ["tallyd", "--listen", "0.0.0.0:50051", "--state-dir", "/var/lib/tally"]

# GPU variant (not built here: it needs NVIDIA's CUDA and a CUDA LibTorch): build on a host or
# image with the CUDA 12/13 toolkit and `pip install torch` (its LibTorch, headers and CMake config
# included), as scripts/gpu/build.sh does on the GPU box: gRPC, Protobuf and Abseil from Debian,
#   cmake -S . -B build-gpu -G Ninja -DCMAKE_PREFIX_PATH="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
# then copy build-gpu/bin and python/ into a runtime image with the CUDA runtime and that torch
# wheel, and run it with `--gpus all` (NVIDIA Container Toolkit); workers then take --device cuda:0.
