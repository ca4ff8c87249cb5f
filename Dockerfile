# Both drivers in one image: /usr/local/bin/efa-driver and
# /usr/local/bin/neuron-driver (the Helm charts pick one with `command`).
# Multi-arch with buildx (EFA exists on Graviton instances too):
#
#   docker buildx build --platform linux/amd64,linux/arm64 -t <registry>/aws-dra-drivers:<tag> --push .
#
# The build stage runs exactly the command that `cargo xtask ci` can run
# outside Docker (see docs/container-image.md), so the compile is exercised
# on every CI run even on machines without a Docker engine.

ARG RUST_VERSION=1.95
# The base images are build arguments so that a machine without registry
# access can substitute local ones (`cargo xtask e2e --cluster kind` builds
# them from Debian packages and the host's Rust toolchain, see
# docs/container-image.md); the defaults are the public images.
ARG BUILD_IMAGE=docker.io/library/rust:${RUST_VERSION}-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12

# Compile for the target platform natively (QEMU under buildx for the
# non-native one): no cross toolchain to keep in sync, same command on both.
FROM ${BUILD_IMAGE} AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p efa-driver -p neuron-driver \
 && mkdir -p /out \
 && cp target/release/efa-driver target/release/neuron-driver /out/

# distroless/cc: glibc + libgcc, no shell, no package manager.
FROM ${RUNTIME_IMAGE} AS runtime
COPY --from=build /out/efa-driver /out/neuron-driver /usr/local/bin/
# Root, deliberately, with every capability dropped by the chart: the host
# directories the drivers write (kubelet plugins and plugins_registry, the
# CDI dir) belong to root, and Neuron's connected_devices/core_count sysfs
# files are readable by root only. UID 0 owns all of these, so it needs no
# capability; any other UID would need CAP_DAC_OVERRIDE, which Kubernetes
# does not grant to non-root containers. See charts/*/values.yaml `privileged`
# for the one thing (Neuron's chip-to-PCI ioctl) that needs more.
USER 0:0
ENTRYPOINT ["/usr/local/bin/efa-driver"]
CMD ["run"]
