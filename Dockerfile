# skyport operator image: a static musl binary on distroless, running as non-root.
#
#   docker build -t skyport:dev .
#   kind load docker-image skyport:dev        # or: k3d image import skyport:dev
#
# Then point the Deployment at it (deploy/README.md, "Build the image yourself").

FROM rust:1.94-alpine AS build
RUN apk add --no-cache musl-dev
WORKDIR /src
COPY . .
# ring and rustls need no system libraries, so the musl build is fully static.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin skyport \
    && cp target/release/skyport /skyport

# CA certificates for AWS endpoints, no shell, uid/gid 65532 (matches deploy/'s runAsUser).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /skyport /skyport
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/skyport"]
CMD ["run"]
