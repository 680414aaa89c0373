# skyport image: one static musl binary on distroless, running as non-root. The same binary is
# the operator (`skyport run`), the in-cluster tunnel client (`skyport tunnel client`, the client
# Deployment runs this image) and the exit server (`skyport tunnel server`, downloaded by the VM).
#
#   docker build -t skyport:dev .
#   kind load docker-image skyport:dev        # or: k3d image import skyport:dev
#
# The release asset exit servers download (README, "Releasing"): the very file the image runs,
# from the same build stage, so its SHA-256 is the one the operator derives from itself:
#
#   docker build --target release-binary --output type=local,dest=dist .   # dist/skyport
#
# Then point the Deployment at it (docs/install.md, "Build the image yourself").
#
# The tests build this file with buildah (tests/env/build-image.sh): no registry is reachable
# there, so `--build-context` supplies the `build` stage (the same musl binary built on the host)
# and the distroless base (a stand-in with its CA bundle and users); the final stage is as below.

FROM rust:1.94-alpine AS build
# gcc: rathole's build script (vergen) compiles C code through the cc crate; make: jemalloc
# (tikv-jemalloc-sys runs its configure and make).
RUN apk add --no-cache musl-dev gcc make
WORKDIR /src
COPY . .
# ring and rustls need no system libraries, so the musl build is fully static.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile dist --locked --bin skyport \
    && cp target/dist/skyport /skyport

FROM scratch AS release-binary
COPY --from=build /skyport /skyport

# CA certificates for AWS endpoints, no shell, uid/gid 65532 (matches deploy/'s runAsUser).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /skyport /skyport
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/skyport"]
CMD ["run"]
