#!/usr/bin/env bash
# The Docker engine and sandbox image that the `docker` sandbox backend's tests run against.
#
#   tools/docker_engine.sh install    apt-get install docker.io + debootstrap (root with apt only)
#   tools/docker_engine.sh start      start dockerd (no-network mode) unless an engine already answers;
#                                     prints the pid of the dockerd it started (nothing if none)
#   tools/docker_engine.sh image      build the sandbox image offline with debootstrap, unless present
#   tools/docker_engine.sh stop PID   stop that dockerd (one `start` printed) and wait for its containerd
#
# dockerd runs as `dockerd --iptables=false --ip-forward=false --bridge=none`: no bridge, no NAT rules,
# no forwarding, so a shared machine's firewall and interfaces are left alone (the sandbox's containers
# use network_mode=none anyway). `install` fails (exit 1) when it is root with apt-get and apt-get fails,
# unless FORGE_ENV_REQUIRE_DOCKER=0; `image` and `swe-image` fail (exit 1) likewise when an engine answers
# and the image cannot be built (no debootstrap, debootstrap or the import failed): `make test` stops there. Every other step that cannot be done here (not root, no apt-get, no
# kernel support) prints why and exits 0; the docker tests then fail where the engine could be installed
# (root with apt-get, or FORGE_ENV_REQUIRE_DOCKER=1) and skip elsewhere, each listed with its reason at the
# end of the run (tests/trust_boundary.py).
#
# Environment: FORGE_ENV_DOCKER_IMAGE (image name, default forge-env/python:bookworm),
# FORGE_ENV_DEBIAN_MIRROR (debootstrap's mirror, default http://deb.debian.org/debian),
# FORGE_ENV_DOCKERD_STATE (where a started daemon's pid file and log go, default /tmp/forge-env-dockerd).
set -uo pipefail

IMAGE="${FORGE_ENV_DOCKER_IMAGE:-forge-env/python:bookworm}"
MIRROR="${FORGE_ENV_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# The packages of an image: the sandbox image holds python3 only; SWE-v0's (swe-image) adds git and pytest.
PACKAGES="python3"
SWE_IMAGE="${FORGE_ENV_SWE_IMAGE:-forge-env/swe:bookworm}"
STATE="${FORGE_ENV_DOCKERD_STATE:-/tmp/forge-env-dockerd}"
PIDFILE="$STATE/dockerd.pid"
LOG="$STATE/dockerd.log"

say() { echo "docker_engine: $*" >&2; }

# What the suite's docker tests do without an engine here (the rule of tests/trust_boundary.py).
required() {
  case "${FORGE_ENV_REQUIRE_DOCKER:-}" in
    1) return 0 ;;
    0) return 1 ;;
  esac
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1
}
outcome() {
  if required; then echo "the docker tests will FAIL (FORGE_ENV_REQUIRE_DOCKER=0 lets them skip)";
  else echo "the docker tests will SKIP (listed at the end of the run)"; fi
}

engine_answers() { command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1; }

install() {
  if command -v dockerd >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1; then return 0; fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    say "WARNING: not root with apt-get: install docker.io and debootstrap yourself; $(outcome)"
    return 0
  fi
  say "installing docker.io and debootstrap"
  # The package would start its service in dockerd's default mode (which rewrites iptables): forbid
  # service starts during the install, the Debian way, unless a policy is already in place.
  local policy=/usr/sbin/policy-rc.d ours=""
  if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && ours=1; fi
  local rc=0
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null) \
    || rc=1
  if [ -n "$ours" ]; then rm -f "$policy"; fi
  if [ $rc != 0 ]; then
    say "apt-get could not install docker.io/debootstrap; $(outcome)"
    if required; then return 1; fi
  fi
  return 0
}

# The containerd of a killed dockerd stays a zombie for a moment, and a dockerd started then takes it for a
# live one and hangs waiting for it: wait until its pid is gone from /proc altogether.
wait_for_managed_containerd_exit() {
  local pid
  pid="$(cat /var/run/docker/containerd/containerd.pid 2>/dev/null)"
  [ -n "$pid" ] || return 0
  for _ in $(seq 1 300); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = containerd ] || return 0  # a zombie keeps its name
    sleep 0.1
  done
  say "docker's containerd (pid $pid) is still there after 30 s"
}

start() {
  if engine_answers; then return 0; fi
  if ! command -v dockerd >/dev/null 2>&1; then say "dockerd is not installed; $(outcome)"; return 0; fi
  if [ "$(id -u)" != 0 ]; then say "starting dockerd needs root; $(outcome)"; return 0; fi
  mkdir -p "$STATE"
  wait_for_managed_containerd_exit
  # dockerd refuses to start while its pid file names a live process, even an unrelated one (pid reuse).
  local stale pid
  stale="$(cat /var/run/docker.pid 2>/dev/null)"
  if [ -n "$stale" ] && [ "$(cat "/proc/$stale/comm" 2>/dev/null)" != dockerd ]; then rm -f /var/run/docker.pid; fi
  setsid dockerd --iptables=false --ip-forward=false --bridge=none >"$LOG" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$PIDFILE"
  for _ in $(seq 1 300); do
    if engine_answers; then say "dockerd started (pid $pid, log $LOG)"; echo "$pid"; return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 0.1
  done
  say "dockerd did not come up; $(outcome). Its log ($LOG):"
  tail -n 20 "$LOG" >&2
  stop "$pid"
  return 0
}

stop() {
  local pid="${1:-}"
  [ -n "$pid" ] || return 0
  # Only a dockerd: the pid may be stale (a crashed run) and now someone else's.
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] || return 0
  kill -TERM "$pid"
  for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then say "dockerd $pid ignored SIGTERM for 20 s: killing it"; kill -KILL "$pid"; fi
  wait_for_managed_containerd_exit
  [ "$(cat "$PIDFILE" 2>/dev/null)" != "$pid" ] || rm -f "$PIDFILE"
  say "dockerd $pid stopped"
}

# A build that failed while the engine answers: exit 1 where the docker tests are required, else 0 (they skip).
build_failed() {
  say "$*; $(outcome)"
  if required; then return 1; fi
  return 0
}

image() {
  if ! engine_answers; then say "no Docker engine answers: cannot build $IMAGE; $(outcome)"; return 0; fi
  if docker image inspect "$IMAGE" >/dev/null 2>&1; then return 0; fi
  if ! command -v debootstrap >/dev/null 2>&1; then build_failed "debootstrap is not installed: cannot build $IMAGE"; return; fi
  local rootfs
  rootfs="$(mktemp -d /var/tmp/forge-env-rootfs.XXXXXX)"
  say "building $IMAGE from Debian bookworm (debootstrap, ~2 min) in $rootfs"
  if ! debootstrap --variant=minbase --include="$PACKAGES" bookworm "$rootfs" "$MIRROR" >"$rootfs.log" 2>&1; then
    say "debootstrap failed. Last lines of $rootfs.log:"
    tail -n 20 "$rootfs.log" >&2
    rm -rf "$rootfs"
    build_failed "could not build $IMAGE"; return
  fi
  # What a sandboxed Python program never needs: package caches and lists, docs, locales, Python's tests.
  rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/{doc,man,info,locale,lintian} \
    "$rootfs"/usr/lib/python3.*/{test,idlelib,tkinter,turtledemo,ensurepip,lib2to3} "$rootfs"/var/log/* \
    "$rootfs"/debootstrap
  tar -C "$rootfs" -c . | docker import -c 'CMD ["python3"]' - "$IMAGE" >/dev/null
  local rc=$?
  rm -rf "$rootfs" "$rootfs.log"
  if [ $rc != 0 ]; then build_failed "docker import failed: could not build $IMAGE"; return; fi
  say "built $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE") bytes)"
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop "${2:-}" ;;
  image) image ;;
  swe-image) IMAGE="$SWE_IMAGE"; PACKAGES="python3,git,python3-pytest"; image ;;
  *) echo "usage: $0 install|start|image|swe-image|stop PID" >&2; exit 2 ;;
esac
