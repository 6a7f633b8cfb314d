#!/usr/bin/env bash
# Build OpenPBS 23.06.06 from the vendored source once, for the tests' real PBS server.
#
# OpenPBS is in no package registry these machines reach, so its source is kept beside the project
# (../shared/vendor/openpbs: the tag's `git archive`, the upstream Python 3.11 patch, SHA256SUMS).
# The install prefix is keyed by the tarball's checksum, so a machine builds it once (about ten
# minutes on two cores) and every later call only prints the prefix.
#
#   scripts/build_openpbs.sh [VENDOR_DIR]     prints the install prefix on stdout
#
# Needs root (pbs_iff and pbs_rcp are setuid root, as `make install` of a site does) and the build
# packages of OpenPBS's INSTALL (Debian line); `.ci/run` installs them.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
VENDOR=${1:-${PILOTFILL_OPENPBS_VENDOR:-$here/../shared/vendor/openpbs}}
[ -f "$VENDOR/SHA256SUMS" ] || { echo "no OpenPBS source at $VENDOR (SHA256SUMS missing)" >&2; exit 1; }
(cd "$VENDOR" && sha256sum --quiet -c SHA256SUMS) || { echo "OpenPBS source at $VENDOR does not match its SHA256SUMS" >&2; exit 1; }
sum=$(sha256sum "$VENDOR/openpbs-23.06.06.tar.gz" | cut -c1-12)
CACHE=${PILOTFILL_OPENPBS_CACHE:-$HOME/.cache/pilotfill}
PREFIX="$CACHE/openpbs-23.06.06-$sum"
if [ -f "$PREFIX/.built" ]; then
    echo "$PREFIX"
    exit 0
fi
[ "$(id -u)" = 0 ] || { echo "building OpenPBS needs root (its pbs_iff and pbs_rcp are setuid root)" >&2; exit 1; }
# Debian's own Python 3 (not a pyenv or venv one): PBS embeds it for hooks and links against its
# libpython, and a normal user's jobs must be able to load it.
PY=${PILOTFILL_OPENPBS_PYTHON:-/usr/bin/python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xzf "$VENDOR/openpbs-23.06.06.tar.gz" -C "$work"
src="$work/openpbs-23.06.06"
(cd "$src" && patch -p1 -s < "$VENDOR/python311-include.patch")
echo "building OpenPBS 23.06.06 into $PREFIX (about ten minutes, once)…" >&2
rm -rf "$PREFIX"
(
    cd "$src"
    ./autogen.sh >"$work/autogen.log" 2>&1 || { tail -30 "$work/autogen.log" >&2; exit 1; }
    PYTHON="$PY" ./configure --prefix="$PREFIX" >"$work/configure.log" 2>&1 || { tail -30 "$work/configure.log" >&2; exit 1; }
    make -j"$(nproc)" >"$work/make.log" 2>&1 || { tail -40 "$work/make.log" >&2; exit 1; }
    make install >"$work/install.log" 2>&1 || { tail -30 "$work/install.log" >&2; exit 1; }
)
chmod 4755 "$PREFIX/sbin/pbs_iff" "$PREFIX/sbin/pbs_rcp"
touch "$PREFIX/.built"
echo "$PREFIX"
