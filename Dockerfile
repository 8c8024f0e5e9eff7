# syntax=docker/dockerfile:1
# Multi-stage build of wallet-server: dependencies are compiled in a layer
# of their own (cached until Cargo.toml or Cargo.lock change), the runtime
# image is Debian slim with one binary, run as a non-root user.

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# 1. Dependencies only: the manifests with empty sources.
COPY Cargo.toml Cargo.lock ./
COPY backend/Cargo.toml backend/askama.toml backend/
COPY client/Cargo.toml client/
COPY loadtest/Cargo.toml loadtest/
COPY sim/Cargo.toml sim/
COPY testkit/Cargo.toml testkit/
RUN mkdir -p backend/src client/src loadtest/src sim/src testkit/src \
    && echo 'fn main() {}' > backend/src/main.rs \
    && touch backend/src/lib.rs client/src/lib.rs loadtest/src/lib.rs sim/src/lib.rs testkit/src/lib.rs \
    && echo 'fn main() {}' > loadtest/src/main.rs \
    && echo 'fn main() {}' > sim/src/main.rs \
    && cargo build --release --locked -p layered-wallet --bin wallet-server \
    && rm -rf backend/src client/src loadtest/src sim/src testkit/src
# 2. The service itself: sources, migrations (embedded), templates and
#    static files (compiled in).
COPY backend/src backend/src
COPY client/src client/src
COPY migrations migrations
COPY web web
RUN touch backend/src/main.rs backend/src/lib.rs client/src/lib.rs \
    && cargo build --release --locked -p layered-wallet --bin wallet-server

FROM debian:bookworm-slim AS runtime
RUN groupadd --system --gid 10001 wallet \
    && useradd --system --uid 10001 --gid wallet --no-create-home --shell /usr/sbin/nologin wallet
COPY --from=build /src/target/release/wallet-server /usr/local/bin/wallet-server
USER 10001:10001
ENV WALLET_HTTP_HOST=0.0.0.0 \
    PORT=8080 \
    LOG_FORMAT=json
EXPOSE 8080
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=5 \
    CMD ["wallet-server", "healthcheck"]
ENTRYPOINT ["wallet-server"]
CMD ["serve"]
