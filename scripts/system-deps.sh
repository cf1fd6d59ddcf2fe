#!/usr/bin/env bash
# Install the Debian packages hotset's demo and tests use, when they are missing:
#   dataset-fashion-mnist  (the demo dataset, /usr/share/datasets/fashion-mnist)
#   redis-server           (the Redis store's tests start a real server)
#   redis-tools            (redis-cli: the tests create a real Redis Cluster)
#   nginx-light            (the HTTP tests serve a dataset tree with nginx)
# `system-deps.sh demo`: the dataset alone (what `make demo` needs).
# Only as root on Debian/Ubuntu; elsewhere it says what to install and exits non-zero.
set -euo pipefail
missing=()
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || missing+=(dataset-fashion-mnist)
[ "${1:-}" = demo ] || {
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
}
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "hotset: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  exit 0
fi
echo "hotset: missing system packages: ${missing[*]}" >&2
echo "hotset: install them with 'sudo apt-get install ${missing[*]}' (Debian/Ubuntu)," >&2
echo "        or point 'hotset prepare imagefolder' at your own data and set HOTSET_REDIS_SERVER." >&2
exit 1
