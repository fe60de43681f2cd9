# gpucompute: build on a CUDA devel image, run on a CUDA runtime image.
#   docker build -t gpucompute .
#   docker run --gpus all -p 50051:50051 -p 9464:9464 gpucompute
# Without a GPU the same image serves on the CPU backend.

FROM nvidia/cuda:13.0.0-devel-ubuntu24.04 AS build
WORKDIR /src
COPY . .
# The same scripts the README uses.
RUN deploy/install-deps.sh && deploy/build.sh release && deploy/bundle.sh /opt/gpucompute build/release

FROM nvidia/cuda:13.0.0-runtime-ubuntu24.04
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      ca-certificates && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home gpucompute
COPY --from=build /opt/gpucompute /opt/gpucompute
ENV PATH=/opt/gpucompute/bin:$PATH LD_LIBRARY_PATH=/opt/gpucompute/lib
USER gpucompute
EXPOSE 50051 9464
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
  CMD ["gpucompute", "--server=127.0.0.1:50051", "--timeout=4s", "health"]
ENTRYPOINT ["gpucompute-server"]
CMD ["--listen=0.0.0.0:50051", "--metrics_listen=0.0.0.0:9464"]
