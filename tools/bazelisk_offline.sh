#!/usr/bin/env bash
# Runs bazelisk offline, with the Bazel the system provides.
#
#   tools/bazelisk_offline.sh build //...
#   tools/bazelisk_offline.sh test //...
#
# bazelisk downloads the Bazel that .bazelversion asks for (4.2.3). Offline,
# this script serves the system's Bazel (Debian package bazel-bootstrap,
# /usr/bin/bazel-4) to it from a throwaway HTTP server on 127.0.0.1, as
# <version>/bazel-<version>-linux-<arch>, points BAZELISK_BASE_URL at it, runs
# `bazelisk "$@"` and stops the server when bazelisk exits. bazelisk caches
# the binary (~/.cache/bazelisk), keyed by the URL; the URL includes a hash of
# the served binary, so an upgraded system Bazel is picked up.
#
# Missing prerequisites are installed (quietly; nothing happens when they are
# there):
#   * apt packages bazel-bootstrap bazel-rules-java bazel-platforms (root, or
#     sudo);
#   * bazelisk, from the npm package @bazel/bazelisk, into a private prefix
#     (${XDG_CACHE_HOME:-~/.cache}/tfce-bazelisk) unless `bazelisk` is already
#     on PATH. Not `npm install -g`: that also installs a `bazel` command,
#     which collides with the bazel-bootstrap one in /usr/bin and fails.
#
# Environment:
#   TFCE_BAZELISK      bazelisk binary to use (default: see above)
#   TFCE_SYSTEM_BAZEL  Bazel binary to serve (default: /usr/bin/bazel-<major>)
#   TFCE_NO_INSTALL=1  never install anything; fail if something is missing
#
# The build itself must not download either: see .bazelrc (system rules_java
# and platforms, local rules_cc, --experimental_repository_disable_download)
# and tools/configure_bazel.py (the TensorFlow repository).
set -euo pipefail

readonly APT_PACKAGES=(bazel-bootstrap bazel-rules-java bazel-platforms)
readonly BAZELISK_NPM_PACKAGE="@bazel/bazelisk@1"
readonly PREFERRED_PORT=42323  # stable, so bazelisk's URL-keyed cache hits

die() { echo "bazelisk_offline: $*" >&2; exit 1; }

as_root() {
  if [[ $(id -u) -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "need root to run: $*"
  fi
}

# --- apt prerequisites -------------------------------------------------------
missing_apt_packages() {
  local pkg
  for pkg in "${APT_PACKAGES[@]}"; do
    if [[ $(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null) \
          != "install ok installed" ]]; then
      echo "$pkg"
    fi
  done
}

ensure_apt_packages() {
  command -v dpkg-query >/dev/null 2>&1 || return 0  # not Debian: trust PATH
  local missing
  missing=$(missing_apt_packages | tr '\n' ' ')
  [[ -z ${missing// } ]] && return 0
  [[ ${TFCE_NO_INSTALL:-0} == 1 ]] && die "missing apt packages: $missing"
  echo "bazelisk_offline: installing $missing" >&2
  export DEBIAN_FRONTEND=noninteractive
  # shellcheck disable=SC2086
  if ! as_root apt-get install -y -qq $missing >/dev/null; then
    as_root apt-get update -qq >/dev/null
    # shellcheck disable=SC2086
    as_root apt-get install -y -qq $missing >/dev/null
  fi
}

# --- bazelisk ----------------------------------------------------------------
bazelisk_platform() {
  case "$(uname -m)" in
    x86_64 | amd64) echo linux_amd64 ;;
    aarch64 | arm64) echo linux_arm64 ;;
    *) die "unsupported machine $(uname -m)" ;;
  esac
}

find_bazelisk() {
  if [[ -n ${TFCE_BAZELISK:-} ]]; then
    [[ -x $TFCE_BAZELISK ]] || die "TFCE_BAZELISK=$TFCE_BAZELISK is not executable"
    echo "$TFCE_BAZELISK"
    return
  fi
  if command -v bazelisk >/dev/null 2>&1; then
    command -v bazelisk
    return
  fi
  local prefix="${XDG_CACHE_HOME:-$HOME/.cache}/tfce-bazelisk"
  # The npm package ships one binary per platform; run it directly (bazelisk.js
  # would only start it through node).
  local binary="$prefix/node_modules/@bazel/bazelisk/bazelisk-$(bazelisk_platform)"
  if [[ ! -x $binary ]]; then
    [[ ${TFCE_NO_INSTALL:-0} == 1 ]] && die "bazelisk is not installed"
    command -v npm >/dev/null 2>&1 || die "bazelisk is missing and npm is not installed"
    echo "bazelisk_offline: installing bazelisk into $prefix" >&2
    mkdir -p "$prefix"
    npm install --prefix "$prefix" --no-audit --no-fund --no-save \
      --loglevel=error "$BAZELISK_NPM_PACKAGE" >/dev/null \
      || die "npm install $BAZELISK_NPM_PACKAGE failed"
    [[ -x $binary ]] || die "bazelisk package has no $binary"
  fi
  echo "$binary"
}

# --- which Bazel -------------------------------------------------------------
# The version bazelisk will ask for: USE_BAZEL_VERSION, or the .bazelversion of
# the workspace the current directory is in (as bazelisk looks it up).
wanted_version() {
  if [[ -n ${USE_BAZEL_VERSION:-} ]]; then
    echo "$USE_BAZEL_VERSION"
    return
  fi
  local dir=$PWD
  while :; do
    if [[ -f $dir/WORKSPACE || -f $dir/WORKSPACE.bazel ]]; then
      [[ -f $dir/.bazelversion ]] || die "$dir has no .bazelversion"
      tr -d '[:space:]' <"$dir/.bazelversion"
      return
    fi
    [[ $dir == / ]] && die "not inside a Bazel workspace: $PWD"
    dir=$(dirname "$dir")
  done
}

system_bazel_version() {
  # Debian's build reports "no_version"; the package version is the truth.
  dpkg-query -W -f='${Version}' bazel-bootstrap 2>/dev/null \
    | sed -e 's/^[0-9]*://' -e 's/[+~-].*$//'
}

# --- mirror ------------------------------------------------------------------
mirror_dir=""
server_pid=""
cleanup() {
  if [[ -n $server_pid ]]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  [[ -n $mirror_dir ]] && rm -rf "$mirror_dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

port=""
start_mirror() {  # $1 = directory to serve; sets server_pid and port
  local port_file="$mirror_dir/port"
  python3 - "$1" "$PREFERRED_PORT" "$port_file" >/dev/null 2>&1 <<'PY' &
import functools, http.server, os, sys

root, preferred, port_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]


class Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass


handler = functools.partial(Handler, directory=root)
for port in (preferred, 0):
    try:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        break
    except OSError:
        continue
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.replace(port_file + ".tmp", port_file)
server.serve_forever()
PY
  server_pid=$!
  local i
  for i in $(seq 1 100); do
    [[ -s $port_file ]] && { port=$(<"$port_file"); return; }
    kill -0 "$server_pid" 2>/dev/null || die "the loopback mirror did not start"
    sleep 0.05
  done
  die "the loopback mirror did not start in time"
}

main() {
  ensure_apt_packages
  local bazelisk version system_version major bazel_binary arch digest
  bazelisk=$(find_bazelisk)
  version=$(wanted_version)
  system_version=$(system_bazel_version)
  major=${version%%.*}
  bazel_binary=${TFCE_SYSTEM_BAZEL:-/usr/bin/bazel-$major}
  [[ -x $bazel_binary ]] || die "no system Bazel $version ($bazel_binary)"
  if [[ -z ${TFCE_SYSTEM_BAZEL:-} && $system_version != "$version" ]]; then
    die "the workspace wants Bazel $version, the system has $system_version" \
        "(bazel-bootstrap); only the system's Bazel can be used offline"
  fi
  case "$(uname -m)" in
    x86_64 | amd64) arch=x86_64 ;;
    aarch64 | arm64) arch=arm64 ;;
    *) die "unsupported machine $(uname -m)" ;;
  esac

  mirror_dir=$(mktemp -d "${TMPDIR:-/tmp}/bazel-mirror.XXXXXX")
  digest=$(sha256sum "$bazel_binary" | cut -c1-16)
  mkdir -p "$mirror_dir/root/$digest/$version"
  ln -s "$(readlink -f "$bazel_binary")" \
    "$mirror_dir/root/$digest/$version/bazel-$version-linux-$arch"
  start_mirror "$mirror_dir/root"

  local status=0
  BAZELISK_BASE_URL="http://127.0.0.1:$port/$digest" \
    USE_BAZEL_VERSION="$version" "$bazelisk" "$@" || status=$?
  return "$status"
}

main "$@"
