# gpucompute: build on a CUDA devel image, run on a CUDA runtime image.
#   docker build --build-arg REVISION=$(git rev-parse --short=12 HEAD) -t gpucompute .
#   docker run --gpus all -p 50051:50051 -p 9464:9464 gpucompute
# Without a GPU the same image serves on the CPU backend.
#
# A CPU-only image on plain Debian (no CUDA toolkit in the build):
#   --build-arg BUILD_IMAGE=debian:bookworm --build-arg RUNTIME_IMAGE=debian:bookworm \
#   --build-arg PRESET=cpu
# (deploy/container/build-cpu-image.sh builds and runs that one with buildah,
# from a base image made with debootstrap.)
ARG BUILD_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04
ARG RUNTIME_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04

FROM ${BUILD_IMAGE} AS build
# release: the CUDA kernels when nvcc is found, the CPU backend always; cpu:
# the CPU backend only.
ARG PRESET=release
# The git revision for gpucompute_build_info (.git is not sent to the build).
ARG REVISION=
WORKDIR /src
COPY . .
# The scripts the README uses; the image needs no tests.
RUN deploy/install-deps.sh build \
    && cmake --preset "${PRESET}" -DGPUCOMPUTE_BUILD_TESTS=OFF -DGPUCOMPUTE_BUILD_BENCH=OFF \
             -DGPUCOMPUTE_REVISION="${REVISION}" \
    && cmake --build --preset "${PRESET}" -j "$(nproc)" \
    && deploy/bundle.sh /opt/gpucompute "build/${PRESET}"

FROM ${RUNTIME_IMAGE}
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      ca-certificates && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home gpucompute
COPY --from=build /opt/gpucompute /opt/gpucompute
ENV PATH=/opt/gpucompute/bin:$PATH LD_LIBRARY_PATH=/opt/gpucompute/lib
# The uid of deploy/kubernetes (runAsUser: 10001), numeric so that
# runAsNonRoot can verify it.
USER 10001
EXPOSE 50051 9464
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
  CMD ["gpucompute", "--server=127.0.0.1:50051", "--timeout=4s", "health"]
ENTRYPOINT ["gpucompute-server"]
CMD ["--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464"]
