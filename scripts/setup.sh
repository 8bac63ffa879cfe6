#!/usr/bin/env bash
# Idempotent setup for salt-virt on Debian 12 (root, no systemd needed).
#   scripts/setup.sh            apt packages + venv (salt 3008.5, libvirt-python, test, docs, packaging and type-check deps) + test guest
# Everything lands in $SALT_VIRT_CACHE (default /var/cache/salt-virt) so a second run takes seconds.
# Prints the venv path on its last line: "venv: PATH".
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
HERE=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${SALT_VIRT_CACHE:-/var/cache/salt-virt}
VENV=${SALT_VIRT_VENV:-$CACHE/venv}
GUEST=${SALT_VIRT_GUEST:-$CACHE/guest}
mkdir -p "$CACHE"
log() { printf '[setup %(%T)T] %s\n' -1 "$*" >&2; }

# 1. Debian packages ---------------------------------------------------------------------------
PKGS=(
  libvirt-daemon-system libvirt-clients qemu-system-x86 qemu-utils gnutls-bin
  libvirt-dev pkg-config dnsmasq-base iptables e2fsprogs iproute2 python3-venv
  busybox-static xz-utils zstd cpio bc fuse3 fdisk util-linux procps
  lvm2 dosfstools ovmf swtpm swtpm-tools xorriso redis-server mmdebstrap
  libxml2-utils parted extlinux syslinux-common
  chromium chromium-driver   # the web console's browser test (tests/integration/test_tenants.py)
)
[ "${WITH_GUESTFS:-0}" = 1 ] && PKGS+=(libguestfs-tools linux-image-amd64)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  apt-get -o DPkg::Lock::Timeout=600 update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
# No udev here: make /dev/kvm usable by libvirt-qemu, or libvirt re-probes QEMU on every call.
if [ -c /dev/kvm ] && getent group kvm >/dev/null; then chgrp kvm /dev/kvm && chmod 0660 /dev/kvm; fi
[ -c /dev/net/tun ] || { mkdir -p /dev/net; mknod /dev/net/tun c 10 200; chmod 0666 /dev/net/tun; }

# 2. Python venv: salt 3008.5 (two-step: its certifi floor is newer than the registry), libvirt ---
# When requirements-test.txt changes, the venv is updated in place (pip installs what is new): the venv is
# shared by every checkout on the machine, and a rebuild from scratch would pull it from under running tests.
# Rebuilt from scratch only when it is missing or VENV_LAYOUT changes (a venv without .layout counts as 1).
VENV_LAYOUT=1
REQ_HASH=$( (cat "$HERE/requirements-test.txt"; echo "$VENV_LAYOUT") | sha256sum | cut -c1-16)
if [ ! -f "$VENV/.ok-$REQ_HASH" ]; then
  if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.layout" 2>/dev/null || echo 1)" = "$VENV_LAYOUT" ] \
     && "$VENV/bin/python" -c 'import salt.version' 2>/dev/null; then
    log "updating venv $VENV (requirements-test.txt changed)"
    "$VENV/bin/pip" install -q --disable-pip-version-check -r "$HERE/requirements-test.txt" 2>&1 \
      | { grep -v -e 'is ignored: it is neither' -e 'dependency resolver does not currently' \
            -e 'requires certifi>=' -e 'which is not installed' >&2 || true; }
  else
    log "building venv $VENV"
    bash "$HERE/scripts/salt-venv.sh" "$VENV" -r "$HERE/requirements-test.txt"
    echo "$VENV_LAYOUT" > "$VENV/.layout"
  fi
  "$VENV/bin/python" -c 'import salt.version, libvirt, saltfactories, sphinx, myst_parser, furo, mypy, cherrypy, build, twine, selenium' || { echo "setup: venv incomplete" >&2; exit 1; }
  touch "$VENV/.ok-$REQ_HASH"
fi

# 3. Tiny bootable test guest (no internet): kernel + busybox initramfs (+ a variant with the QEMU guest
# agent) + seedable disks --------------------------------------------------------------------------
# Rebuilt when build-guest.sh changes (hash stamp), into a new directory renamed into place: a guest
# directory is never half-built.
GUEST_HASH=$(sha256sum < "$HERE/scripts/build-guest.sh" | cut -c1-16)
if [ ! -f "$GUEST/.ok-$GUEST_HASH" ] || [ ! -s "$GUEST/initrd.img" ] || [ ! -s "$GUEST/disk.raw" ] \
   || [ ! -s "$GUEST/initrd-qga.img" ] || [ ! -s "$GUEST/vmlinux" ] || [ ! -s "$GUEST/boot.qcow2" ]; then
  log "building test guest in $GUEST"
  NEW=$(mktemp -d "${GUEST%/}.new.XXXXXX")
  bash "$HERE/scripts/build-guest.sh" "$NEW"
  touch "$NEW/.ok-$GUEST_HASH"
  chmod 755 "$NEW"
  if [ -e "$GUEST" ]; then
    OLD=$(mktemp -d "${GUEST%/}.old.XXXXXX")
    mv "$GUEST" "$OLD/guest" && mv "$NEW" "$GUEST" && rm -rf "$OLD"
  else
    mv "$NEW" "$GUEST"
  fi
fi
# 4. Debian 12 guest image with salt-minion (the tutorial's last step; ~3-6 min the first time) ----
# Rebuilt only when its recipe (build script + salt venv recipe) changes. SALT_VIRT_DEBIAN_VARIANTS
# adds "nominion" (an image without salt-minion); SALT_VIRT_DEBIAN_VARIANTS="" skips the images.
DEBIAN=${SALT_VIRT_DEBIAN:-$CACHE/debian}
DEB_HASH=$(cat "$HERE/scripts/build-debian-image.sh" "$HERE/scripts/salt-venv.sh" | sha256sum | cut -c1-16)
for variant in ${SALT_VIRT_DEBIAN_VARIANTS-minion}; do
  if [ ! -f "$DEBIAN/.ok-$variant-$DEB_HASH" ]; then
    log "building Debian guest image ($variant) in $DEBIAN"
    rm -f "$DEBIAN"/.ok-"$variant"-*
    bash "$HERE/scripts/build-debian-image.sh" "$DEBIAN" "$variant"
    touch "$DEBIAN/.ok-$variant-$DEB_HASH"
  fi
done

# 5. Uyuni's virtualization SLS files for tests/integration/test_uyuni_real.py (GPL-2.0: kept out of the
# repository, pinned by sha256); offline or changed upstream: the test is skipped and says why
bash "$HERE/scripts/uyuni-sls.sh" || log "Uyuni's SLS files incomplete: test_uyuni_real.py will be skipped"
log "ok"
echo "venv: $VENV"
