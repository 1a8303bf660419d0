#!/usr/bin/env bash
# Puts onnxruntime's C/C++ headers in DIR (default: build/onnxruntime-headers), from Debian 13's
# package libonnxruntime-dev (1.21), on any Debian-like machine: the package is downloaded with
# apt-get from a private list of Debian 13 (trixie) sources in a temporary folder, and unpacked;
# nothing is installed and the machine's apt configuration is left alone. Prints DIR.
#
# On Debian 13 itself, `apt-get install libonnxruntime-dev` puts them in /usr/include/onnxruntime.
# Any libonnxruntime.so.1 at least as new as the headers links with them (the C API is
# versioned): a stock onnxruntime wheel's onnxruntime/capi/libonnxruntime.so.1.*, or
# onnxruntime-node's bin/napi-v6/linux/x64/libonnxruntime.so.1.
set -euo pipefail
dest=$(realpath -m "${1:-build/onnxruntime-headers}")
if [ -f "$dest/onnxruntime_cxx_api.h" ]; then echo "$dest"; exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
# the Debian archive this machine's apt already uses (its first source that is not the security one)
mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs: *//p' | tr ' ' '\n' | grep -v security | head -1 || true)
if [ -z "$mirror" ]; then
  mirror=$(grep -hE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
    sed -E 's/^deb (\[[^]]*\] )?//; s/ .*//' | grep -v security | head -1 || true)
fi
[ -n "$mirror" ] || { echo "no Debian archive found in /etc/apt's sources" >&2; exit 1; }
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" >"$work/sources.list"
apt=(-o "Dir::Etc::sourcelist=$work/sources.list" -o Dir::Etc::sourceparts=- -o "Dir::State::Lists=$work/lists"
  -o "Dir::Cache=$work/cache" -o APT::Sandbox::User=root -q)
apt-get "${apt[@]}" update >&2
(cd "$work" && apt-get "${apt[@]}" download libonnxruntime-dev >&2)
dpkg-deb -x "$work"/libonnxruntime-dev_*.deb "$work/root"
mkdir -p "$dest"
cp -r "$work/root/usr/include/onnxruntime/." "$dest/"
echo "$dest"
