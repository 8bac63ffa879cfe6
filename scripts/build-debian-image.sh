#!/usr/bin/env bash
# Build a realistic Debian 12 guest image locally (the tutorial's last step: its minion answers test.ping).
#   build-debian-image.sh OUTDIR [minion|nominion]
# OUTDIR/debian-<variant>.qcow2   1 GiB virtual, MBR disk, partition 1 = ext4 root, extlinux boot loader,
#                                 systemd, linux-image-cloud-amd64, python3, systemd-networkd (DHCP on every
#                                 ethernet NIC), and with "minion": salt-minion 3008.5 in /opt/saltstack/salt
#                                 (the same two-step install as scripts/salt-venv.sh), enabled at boot.
# OUTDIR/debian-<variant>.vmlinuz, .initrd, .cmdline   the image's kernel, initrd and command line, for a
#                                 direct kernel boot (virt.init boot={kernel, initrd, cmdline}: no BIOS, no
#                                 boot loader); the image boots with or without them.
# The kernel logs to ttyS0. Boot phases are marked there as "SV-PHASE <name> <seconds since the kernel
# started>": systemd (PID 1 runs units), dhcp (a routable address), minion-start (just before the minion's
# Python starts; also "SALT-MINION-START <id>"). SV_IMAGE_DEBUG=1 (or "sv.debug" on the kernel command
# line of a direct boot) also forwards the journal to ttyS0 (monotonic timestamps), runs the minion with
# "-l debug" and, a minute after the boot has finished, prints systemd-analyze blame, a profile of the
# minion's grains and its import times, then "SV-DEBUG-END".
# Packages come from the distribution mirror apt is configured with (mmdebstrap), salt from PyPI.
set -euo pipefail
OUT=$(realpath -m "${1:?usage: build-debian-image.sh OUTDIR [minion|nominion]}")
VARIANT=${2:-minion}
case "$VARIANT" in minion|nominion) ;; *) echo "build-debian-image: variant is minion or nominion" >&2; exit 2;; esac
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
WORK=$(mktemp -d /var/tmp/svdeb.XXXXXX)
LOOP=
cleanup() {
  mountpoint -q "$WORK/mnt" && umount "$WORK/mnt"
  [ -n "$LOOP" ] && losetup -d "$LOOP"
  rm -rf "$WORK"
}
trap cleanup EXIT

# 1. root filesystem ---------------------------------------------------------------------------------
HOOK="$WORK/customize.sh"
cat > "$HOOK" <<'HOOK'
#!/bin/sh
set -e
R=$1
echo salt-virt-guest > "$R/etc/hostname"
printf '127.0.0.1 localhost\n' > "$R/etc/hosts"
printf '/dev/vda1 / ext4 defaults,noatime 0 1\n' > "$R/etc/fstab"
mkdir -p "$R/etc/systemd/network"
printf '[Match]\nType=ether\n\n[Network]\nDHCP=ipv4\n\n[DHCPv4]\nUseDomains=yes\nUseHostname=no\n' \
  > "$R/etc/systemd/network/50-dhcp.network"
chroot "$R" systemctl enable systemd-networkd.service systemd-resolved.service >/dev/null 2>&1
# network-online = one NIC has a routable address (the DHCP lease), at most 30 s: the minion starts after it,
# so its grains (ipv4, ...) hold the leased address; a VM without a lease still starts its minion
mkdir -p "$R/etc/systemd/system/systemd-networkd-wait-online.service.d"
printf '[Service]\nExecStart=\nExecStart=/lib/systemd/systemd-networkd-wait-online --any --timeout=30\n' \
  > "$R/etc/systemd/system/systemd-networkd-wait-online.service.d/any.conf"
chroot "$R" systemctl enable systemd-networkd-wait-online.service >/dev/null 2>&1
# a smaller initrd: the modules the root disk needs (virtio), not most of the kernel's drivers
printf 'virtio_pci\nvirtio_blk\n' >> "$R/etc/initramfs-tools/modules"
sed -i 's/^MODULES=.*/MODULES=list/' "$R/etc/initramfs-tools/initramfs.conf"
chroot "$R" update-initramfs -u -k all >/dev/null 2>&1
# boot phase markers on the serial console (bench/bench_tutorial.py reads them)
cat > "$R/usr/local/sbin/sv-phase" <<'EOS'
#!/bin/sh
# sv-phase NAME: "SV-PHASE NAME <seconds since the kernel started>" on the serial console (shell builtins
# only: no process more than the shell on the boot's path); minion-start is also "SALT-MINION-START <id>"
read -r up _ < /proc/uptime
{
  [ "$1" = minion-start ] && { id=; read -r id < /etc/salt/minion_id; echo "SALT-MINION-START $id"; }
  echo "SV-PHASE $1 $up"
} > /dev/ttyS0 2>/dev/null || true
EOS
chmod 755 "$R/usr/local/sbin/sv-phase"
cat > "$R/etc/systemd/system/sv-phase-systemd.service" <<'UNIT'
[Unit]
Description=Boot phase marker: systemd runs units
DefaultDependencies=no

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/sv-phase systemd

[Install]
WantedBy=sysinit.target
UNIT
cat > "$R/etc/systemd/system/sv-phase-dhcp.service" <<'UNIT'
[Unit]
Description=Boot phase marker: a routable address (DHCP lease)
After=systemd-networkd.service

[Service]
# simple, not oneshot: multi-user.target does not wait for it
Type=simple
ExecStart=/bin/sh -c '/lib/systemd/systemd-networkd-wait-online --any --timeout=300 --quiet && exec /usr/local/sbin/sv-phase dhcp'

[Install]
WantedBy=multi-user.target
UNIT
cat > "$R/usr/local/sbin/sv-debug-report" <<'EOS'
#!/bin/sh
# sv.debug: once the boot has finished and the minion had time to connect, where the time went
systemctl is-system-running --wait >/dev/null 2>&1
sleep "${1:-60}"
exec > /dev/ttyS0 2>&1
systemd-analyze; systemd-analyze blame | head -30
systemd-analyze critical-chain salt-minion.service sv-phase-dhcp.service
PY=/opt/saltstack/salt/bin/python
if [ -x $PY ]; then
  echo "--- salt.loader.grains under cProfile"
  $PY -c 'import cProfile, pstats, time, salt.config, salt.loader
o = salt.config.minion_config("/etc/salt/minion"); p = cProfile.Profile(); t = time.time(); p.enable()
g = salt.loader.grains(o, force_refresh=True); p.disable(); print("grains: %.2f s, %d grains" % (time.time() - t, len(g)))
pstats.Stats(p).sort_stats("cumulative").print_stats(35)'
  echo "--- import time of the minion (microseconds, cumulative)"
  $PY -X importtime -c 'import salt.scripts, salt.cli.daemons, salt.minion' 2>&1 | sort -t'|' -k2 -n | tail -30
fi
echo SV-DEBUG-END
EOS
chmod 755 "$R/usr/local/sbin/sv-debug-report"
cat > "$R/etc/systemd/system/sv-debug-report.service" <<'UNIT'
[Unit]
Description=Debug: boot and minion start-up report on the serial console
ConditionKernelCommandLine=sv.debug

[Service]
# simple, not oneshot: the boot does not wait for it
Type=simple
ExecStart=/usr/local/sbin/sv-debug-report 60

[Install]
WantedBy=multi-user.target
UNIT
cat > "$R/etc/systemd/system/sv-debug-env.service" <<'UNIT'
[Unit]
Description=Debug: the minion logs at debug level
ConditionKernelCommandLine=sv.debug
DefaultDependencies=no
Before=salt-minion.service

[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo SV_MINION_ARGS=-l debug > /run/sv-debug.env'

[Install]
WantedBy=sysinit.target
UNIT
chroot "$R" systemctl enable sv-phase-systemd.service sv-phase-dhcp.service sv-debug-report.service \
  sv-debug-env.service >/dev/null 2>&1
# nothing a fresh cloud guest needs at boot (no LVM snapshots to reap, no unattended apt runs)
chroot "$R" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service \
  fstrim.timer >/dev/null 2>&1 || true
chroot "$R" passwd -d root >/dev/null
# a serial login for debugging (root, no password: lab image only)
chroot "$R" systemctl enable serial-getty@ttyS0.service >/dev/null 2>&1 || true
rm -rf "$R"/usr/share/doc/* "$R"/usr/share/man/* "$R"/usr/share/info/* "$R"/var/cache/apt/*.bin \
  "$R"/var/lib/apt/lists/*
find "$R"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'en*' -exec rm -rf {} + 2>/dev/null || true
HOOK
MINION_HOOK="$WORK/minion.sh"
cat > "$MINION_HOOK" <<'HOOK'
#!/bin/sh
set -e
R=$1
# the wheels were built on this host (same Debian release, same python3): no network, no compiler inside
chroot "$R" python3 -m venv /opt/saltstack/salt
chroot "$R" /opt/saltstack/salt/bin/pip install -q --no-index --find-links /tmp/wheels --no-deps salt==3008.5
chroot "$R" /opt/saltstack/salt/bin/pip install -q --no-index --find-links /tmp/wheels -r /tmp/wheels/salt-deps.txt
rm -rf "$R/tmp/wheels"
mkdir -p "$R/etc/salt/minion.d" "$R/etc/salt/pki/minion"
# the image's own minion settings, for a fast first start (docs/topics/images.md); a later file in
# minion.d (salt-virt's seeded 99-salt-virt.conf, minion_config=) overrides any of them
cat > "$R/etc/salt/minion.d/10-image.conf" <<'CONF'
# the minion computes its grains at start and again once connected: the second time from this cache
grains_cache: True
# no reverse DNS lookup of every address (waits for DNS timeouts when no resolver answers)
enable_fqdns_grains: False
# no lspci
enable_gpu_grains: False
CONF
for b in salt-minion salt-call; do ln -sf /opt/saltstack/salt/bin/$b "$R/usr/bin/$b"; done
cat > "$R/etc/systemd/system/salt-minion.service" <<'UNIT'
[Unit]
Description=The Salt Minion
After=network-online.target systemd-networkd.service nss-lookup.target
Wants=network-online.target

[Service]
Type=simple
# one shell for both markers ("SALT-MINION-START <id>" and "SV-PHASE minion-start <uptime>")
ExecStartPre=/usr/local/sbin/sv-phase minion-start
# sv.debug: sv-debug-env.service writes SV_MINION_ARGS=-l debug
EnvironmentFile=-/run/sv-debug.env
ExecStart=/opt/saltstack/salt/bin/salt-minion $SV_MINION_ARGS
KillMode=process
Restart=on-failure
RestartSec=2

[Install]
WantedBy=multi-user.target
UNIT
# The minion's first start reads ~750 files from a cold disk, one small read after the other (under TCG its
# unit's start -> Salt's first log line: 4-7 s cold, 3.3 s read ahead). The boot keeps the vCPU busy up to
# the lease, so work at the lowest CPU priority runs only in the last moment before it (measured: importing
# them in a second Python ran after the first ping; reading them with cat at nice 19 ended after the
# minion's start in 2 of 3 boots, asking for them at nice 19 in 1 of 3). So a short burst at normal
# priority after local-fs.target: one open and posix_fadvise(WILLNEED) per file of the list made below (at
# host speed); the reads then run beside the boot without the CPU. Not ordered before anything: the
# minion, the lease and the boot never wait for it ("SV-PHASE prefetch" on the console once all is asked).
cat > "$R/usr/local/sbin/sv-minion-prefetch" <<'EOS'
#!/usr/bin/python3 -SI
import os

for path in open("/usr/local/share/sv-minion-prefetch.list").read().split():
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)
    except OSError:
        pass
os.execv("/usr/local/sbin/sv-phase", ["sv-phase", "prefetch"])
EOS
chmod 755 "$R/usr/local/sbin/sv-minion-prefetch"
cat > "$R/etc/systemd/system/sv-minion-prefetch.service" <<'UNIT'
[Unit]
Description=Read the minion's files ahead into the page cache while the boot goes on
DefaultDependencies=no
After=local-fs.target
Conflicts=shutdown.target

[Service]
Type=simple
IOSchedulingClass=best-effort
IOSchedulingPriority=7
ExecStart=/usr/local/sbin/sv-minion-prefetch

[Install]
WantedBy=multi-user.target
UNIT
chroot "$R" systemctl enable salt-minion.service sv-minion-prefetch.service >/dev/null 2>&1
find "$R/opt/saltstack/salt" -name tests -type d -path '*site-packages/*' -prune -exec rm -rf {} + 2>/dev/null || true
# bytecode compiled here, at host speed: an emulated (TCG) guest would otherwise compile salt on its first start
chroot "$R" /opt/saltstack/salt/bin/python -m compileall -q -j 0 /opt/saltstack/salt/lib >/dev/null || true
# what the minion's start reads up to its first answer (interpreter, shared libraries, the modules, grain and
# execution modules it loads, as bytecode; salt.channel.server pulls in GitPython), for sv-minion-prefetch
mkdir -p "$R/usr/local/share"
chroot "$R" /opt/saltstack/salt/bin/python -c 'import salt.cli.daemons, salt.minion, salt.crypt, salt.config, salt.loader
import salt.transport.zeromq, salt.transport.tcp, salt.channel.server, salt.utils.schedule, salt.pillar, os, sys
import salt.cache.localfs_key, salt.modules.cmdmod, salt.modules.config, salt.modules.mine, salt.modules.timezone
import salt.modules.test, salt.matchers.glob_match, salt.executors.direct_call, salt.renderers.yaml
salt.loader.grain_funcs(salt.config.minion_config(None, minion_id="sv-prefetch"))._load_all()
files = {os.path.realpath(sys.executable)}
for m in list(sys.modules.values()):
    spec = getattr(m, "__spec__", None)
    files.update(f for f in (getattr(spec, "cached", None), getattr(m, "__file__", None)) if f and not f.endswith(".py"))
try:
    files.update(ln.split()[-1] for ln in open("/proc/self/maps") if ln.rstrip().endswith(".so") or ".so." in ln)
except OSError:
    pass
print("\n".join(sorted(f for f in files if os.path.isfile(f))))' > "$R/usr/local/share/sv-minion-prefetch.list"
HOOK
chmod +x "$HOOK" "$MINION_HOOK"
HOOKS=(--customize-hook="$HOOK \"\$1\"")
if [ "$VARIANT" = minion ]; then
  # salt 3008.5 and its requirements as wheels, built here with the host venv's pip (scripts/salt-venv.sh
  # made it: same two-step recipe, same relaxed certifi floor); some requirements (timelib) are sdists
  # that need a compiler, which the image does not carry.
  HOST_VENV=${SALT_VIRT_VENV:-/var/cache/salt-virt/venv}
  [ -f "$HOST_VENV/salt-deps.txt" ] || { echo "build-debian-image: run scripts/setup.sh first (needs $HOST_VENV)" >&2; exit 1; }
  mkdir -p "$WORK/wheels"
  "$HOST_VENV/bin/pip" wheel -q --disable-pip-version-check -w "$WORK/wheels" --no-deps salt==3008.5 2>&1 | grep -v 'is ignored' >&2 || true
  "$HOST_VENV/bin/pip" wheel -q --disable-pip-version-check -w "$WORK/wheels" -r "$HOST_VENV/salt-deps.txt" 2>&1 | grep -v 'is ignored' >&2 || true
  cp "$HOST_VENV/salt-deps.txt" "$WORK/wheels/"
  ls "$WORK"/wheels/salt-3008.5-*.whl >/dev/null
  HOOKS+=(--customize-hook="copy-in $WORK/wheels /tmp" --customize-hook="$MINION_HOOK \"\$1\"")
fi
mkdir -p "$WORK/root"
mmdebstrap --quiet --variant=minbase --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --include=systemd-sysv,udev,systemd-resolved,linux-image-cloud-amd64,python3,python3-venv,iproute2,ca-certificates,dbus,procps \
  "${HOOKS[@]}" bookworm "$WORK/root"

# 2. disk: MBR, partition 1 ext4 from the tree (no mount for the content), extlinux ------------------
SIZE_MIB=1024
RAW="$WORK/disk.raw"
truncate -s ${SIZE_MIB}M "$RAW"
printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q "$RAW"
truncate -s $((SIZE_MIB - 1))M "$WORK/part.img"
KVER=$(ls "$WORK/root/lib/modules" | head -1)
CMDLINE="root=/dev/vda1 ro console=ttyS0 quiet systemd.show_status=0 net.ifnames=0"
[ "${SV_IMAGE_DEBUG:-0}" = 1 ] && CMDLINE="root=/dev/vda1 ro console=ttyS0 net.ifnames=0 sv.debug systemd.journald.forward_to_console=1"
mkdir -p "$WORK/root/boot/extlinux"
cat > "$WORK/root/boot/extlinux/extlinux.conf" <<EOF
DEFAULT debian
TIMEOUT 0
PROMPT 0
LABEL debian
  LINUX /boot/vmlinuz-$KVER
  INITRD /boot/initrd.img-$KVER
  APPEND $CMDLINE
EOF
# the resolver is systemd-resolved (DNS servers from DHCP; the local host name answered locally), never the
# build host's /etc/resolv.conf: a name server the guest cannot reach makes every lookup wait for its
# timeout (the minion's hostname and fqdn grains: 3 lookups x 5 s at each grains refresh)
rm -f "$WORK/root/etc/resolv.conf"
ln -s ../run/systemd/resolve/stub-resolv.conf "$WORK/root/etc/resolv.conf"
mkfs.ext4 -q -F -L root -O ^metadata_csum_seed -d "$WORK/root" "$WORK/part.img"
dd if="$WORK/part.img" of="$RAW" bs=1M seek=1 conv=notrunc,sparse status=none
rm -f "$WORK/part.img"
LOOP=$(losetup -f --show -o $((2048 * 512)) "$RAW")
mkdir -p "$WORK/mnt"
mount "$LOOP" "$WORK/mnt"
extlinux --install "$WORK/mnt/boot/extlinux" >/dev/null 2>&1
umount "$WORK/mnt"
losetup -d "$LOOP"; LOOP=
dd if=/usr/lib/EXTLINUX/mbr.bin of="$RAW" conv=notrunc bs=440 count=1 status=none
qemu-img convert -c -f raw -O qcow2 "$RAW" "$OUT/debian-$VARIANT.qcow2.tmp"
# the kernel, initrd and command line for a direct kernel boot, next to the image
install -m 644 "$WORK/root/boot/vmlinuz-$KVER" "$OUT/debian-$VARIANT.vmlinuz.tmp"
install -m 644 "$WORK/root/boot/initrd.img-$KVER" "$OUT/debian-$VARIANT.initrd.tmp"
echo "$CMDLINE" > "$OUT/debian-$VARIANT.cmdline.tmp"
chmod 644 "$OUT/debian-$VARIANT.qcow2.tmp" "$OUT/debian-$VARIANT.cmdline.tmp"
for f in vmlinuz initrd cmdline qcow2; do mv "$OUT/debian-$VARIANT.$f.tmp" "$OUT/debian-$VARIANT.$f"; done
ls -la "$OUT"/debian-"$VARIANT".* >&2
