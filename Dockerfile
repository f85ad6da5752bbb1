# Multi-stage build of the static binary; the last stage holds /quiesce alone, so images write
#   COPY --from=<this image> /quiesce /sbin/quiesce
# Offline (no Rust image to pull), build the final stage from a host-built binary instead:
#   cargo build --release && docker build -f docker/Dockerfile.prebuilt -t quiesce .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# .git stays out of the context, so the version line says `git unknown` unless told:
#   docker build --build-arg QUIESCE_GIT_COMMIT=$(git rev-parse --short=12 HEAD) .
ARG QUIESCE_GIT_COMMIT
RUN rustup target add x86_64-unknown-linux-musl \
 && cargo build --release --locked --bin quiesce \
 && cp target/x86_64-unknown-linux-musl/release/quiesce /quiesce

FROM scratch
COPY --from=build /quiesce /quiesce
