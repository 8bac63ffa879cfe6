#!/usr/bin/env bash
# Build a tiny bootable test guest with no internet, from Debian packages only (~6 s).
#   build-guest.sh OUTDIR
# OUTDIR/vmlinuz, OUTDIR/initrd.img   Debian kernel + busybox initramfs; boot with console=ttyS0
# OUTDIR/vmlinux                    the same kernel as QEMU starts it fastest: uncompressed, through its PVH
#                                   entry (the bzImage itself when the kernel has none); what the tests boot
# OUTDIR/disk.raw, OUTDIR/disk.qcow2  64 MiB MBR disk, partition 1 = ext4 "root" with /etc/salt and /seed.txt
# OUTDIR/boot.qcow2                 32 MiB MBR disk that boots by itself (extlinux): the kernel and initrd.img
#                                   with console=ttyS0 console=tty0 guest.ip=dhcp (the markers on the screen too)
# The initramfs /init prints on the serial console:
#   GUEST-BOOT-OK ...            kernel is up
#   SEED: <line>                 /seed.txt of the first ext4 found on vda1/vda/sda1/sda
#   SALT-MINION-ID: <id>         /etc/salt/minion_id written by seeding (absent if not seeded)
#   SALT-MINION-CONF: <file> <one line>   each /etc/salt/minion.d/*.conf, newlines folded to ' | '
#   SALT-MINION-KEY: <sha256 of minion.pub>  /etc/salt/pki/minion/minion.pub
#   CIDATA-USER: sha256=<hex> first=<line>   a cloud-init NoCloud CD (label cidata, SATA) is attached:
#   CIDATA-META: <meta-data, newlines folded to ' | '>   what it holds (CIDATA-NET: sha256=... first=...
#   CIDATA-WRITE: <path>         / none; each write_files path in user-data); no CD: none of these
#   NET-UP eth0 <ip>             when guest.ip=ADDR/len (or dhcp) is on the kernel cmdline
#   BOOT-HOOK: <unit> rc=<n>     after the network: the disk's enabled salt-virt-*.service one-shot units
#                                (multi-user.target.wants) run like systemd would, their ExecStart script
#                                from the disk with the initramfs's busybox (their own output is shown too)
#   HB <n>                       heartbeat every second (guest.mode=poweroff powers off instead)
# OUTDIR/initrd-qga.img             the same plus the QEMU guest agent (Debian's qemu-ga, its libraries, the
#                                   virtio_console module): it mounts the disk's ext4 read-write on /data,
#                                   starts qemu-ga on the org.qemu.guest_agent.0 port, then prints
#   QGA-UP <device> on /data     (or QGA-FAILED: <why>) and each heartbeat first writes <n> to /data/heartbeat,
#                                so "HB <n>" shows the filesystem took a write (a frozen one blocks it)
set -euo pipefail
OUT=$(realpath -m "${1:?usage: build-guest.sh OUTDIR}")
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
chmod 755 "$WORK"   # apt-get download runs as _apt
KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
if [ -z "$KPKG" ]; then apt-get update -qq; KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}'); fi
[ -n "$KPKG" ] || { echo "build-guest: cannot resolve the kernel package" >&2; exit 1; }
PKGS="$KPKG busybox-static qemu-guest-agent"
apt-get download -q $PKGS >/dev/null 2>&1 || apt-get download $PKGS
dpkg-deb -x "$KPKG"_*.deb kx
dpkg-deb -x busybox-static_*.deb bbx
dpkg-deb -x qemu-guest-agent_*.deb qga
KVER=$(ls kx/lib/modules)
cp kx/boot/vmlinuz-"$KVER" "$OUT"/vmlinuz.tmp
# Under TCG a bzImage boot spends half its CPU before the kernel runs (SeaBIOS, real-mode setup, the xz
# decompression: 6.6 CPU-s a boot, 3.3 from the PVH entry, measured with qemu 7.2); the suite boots dozens.
python3 - "$OUT"/vmlinuz.tmp "$OUT"/vmlinux.tmp <<'PVH'
import gzip, io, lzma, struct, sys
src, dst = sys.argv[1:]
image = open(src, "rb").read()
def elf_with_pvh(data):  # an ELF64 whose notes hold Xen's PHYS32_ENTRY (type 18): QEMU boots it directly
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return False
    phoff, phentsize, phnum = struct.unpack_from("<Q", data, 32)[0], *struct.unpack_from("<HH", data, 54)
    for i in range(phnum):
        ptype, _, off, _, _, size = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        pos, end = off, off + size
        while ptype == 4 and pos + 12 <= end:  # PT_NOTE
            namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
            name = data[pos + 12 : pos + 12 + namesz].rstrip(b"\0")
            if name == b"Xen" and ntype == 18:
                return True
            pos += 12 + (namesz + 3) // 4 * 4 + (descsz + 3) // 4 * 4
    return False
kernel = None
for magic, opener in ((b"\xfd7zXZ\0", lambda b: lzma.LZMADecompressor().decompress(b)),
                      (b"\x1f\x8b\x08", lambda b: gzip.GzipFile(fileobj=io.BytesIO(b)).read())):
    at = image.find(magic)
    while kernel is None and at >= 0:
        try:
            out = opener(image[at:])
        except (lzma.LZMAError, OSError, EOFError):
            out = b""
        kernel = out if elf_with_pvh(out) else None
        at = image.find(magic, at + 1)
open(dst, "wb").write(kernel or image)
print("build-guest: vmlinux is the", "uncompressed kernel (PVH entry)" if kernel else "bzImage (no PVH entry)")
PVH

R=rootfs
mkdir -p $R/bin $R/proc $R/sys $R/dev $R/mnt $R/tmp $R/lib/mod $R/etc
cp bbx/bin/busybox $R/bin/busybox
MODS="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci failover net_failover virtio_net virtio_blk crc16 mbcache jbd2 crc32c_generic ext4 e1000"
MODS="$MODS scsi_common scsi_mod libata libahci ahci cdrom sr_mod isofs"  # the cidata CD on SATA (AHCI)
: > $R/lib/mod/order
module() {  # module NAME DESTDIR: the kernel's module, uncompressed
  local f
  f=$(find kx/lib/modules/"$KVER"/kernel -name "$1.ko*" | head -1)
  [ -n "$f" ] || { echo "build-guest: module $1 not found" >&2; exit 1; }
  case "$f" in
    *.ko.xz) xz -dc "$f" > "$2/$1.ko" ;;
    *.ko.zst) zstd -qdc "$f" > "$2/$1.ko" ;;
    *) cp "$f" "$2/$1.ko" ;;
  esac
}
for m in $MODS; do
  module "$m" $R/lib/mod
  echo "$m" >> $R/lib/mod/order
done
cat > $R/init <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
for m in $(cat /lib/mod/order); do insmod /lib/mod/$m.ko 2>/dev/null; done
IP=; MODE=heartbeat
for a in $(cat /proc/cmdline); do
  case "$a" in guest.ip=*) IP=${a#guest.ip=};; guest.mode=*) MODE=${a#guest.mode=};; esac
done
echo "GUEST-BOOT-OK uptime=$(cut -d' ' -f1 /proc/uptime) kernel=$(uname -r)"
for i in 1 2 3 4 5 6 7 8 9 10; do [ -b /dev/vda ] || [ -b /dev/sda ] && break; sleep 0.3; done
ROOT=
for d in /dev/vda1 /dev/vda /dev/sda1 /dev/sda; do
  if [ -b $d ] && mount -t ext4 -o ro $d /mnt 2>/dev/null; then
    ROOT=$d
    [ -f /mnt/seed.txt ] && echo "SEED: $(cat /mnt/seed.txt)"
    [ -f /mnt/etc/salt/minion_id ] && echo "SALT-MINION-ID: $(cat /mnt/etc/salt/minion_id)"
    for c in /mnt/etc/salt/minion.d/*.conf; do
      [ -f "$c" ] && echo "SALT-MINION-CONF: ${c#/mnt} $(tr '\n' '|' < $c | sed 's/|/ | /g')"
    done
    [ -f /mnt/etc/salt/pki/minion/minion.pub ] && echo "SALT-MINION-KEY: $(sha256sum /mnt/etc/salt/pki/minion/minion.pub | cut -d' ' -f1)"
    umount /mnt; break
  fi
done
if ls /sys/bus/pci/drivers/ahci/0000:* >/dev/null 2>&1; then  # a SATA controller: maybe the cidata CD
  for i in $(seq 1 25); do [ -b /dev/sr0 ] && break; sleep 0.2; done
  mkdir -p /cd
  if [ -b /dev/sr0 ] && mount -t iso9660 -o ro /dev/sr0 /cd 2>/dev/null; then
    if [ -f /cd/user-data ]; then
      echo "CIDATA-USER: sha256=$(sha256sum /cd/user-data | cut -d' ' -f1) first=$(head -n1 /cd/user-data)"
      grep -o '^- path: .*' /cd/user-data | while read -r _ _ p; do echo "CIDATA-WRITE: $p"; done
    fi
    [ -f /cd/meta-data ] && echo "CIDATA-META: $(tr '\n' '|' < /cd/meta-data | sed 's/|/ | /g')"
    if [ -f /cd/network-config ]; then
      echo "CIDATA-NET: sha256=$(sha256sum /cd/network-config | cut -d' ' -f1) first=$(head -n1 /cd/network-config)"
    else
      echo "CIDATA-NET: none"
    fi
    umount /cd
  fi
fi
ip link set lo up
if [ -n "$IP" ]; then
  for i in 1 2 3 4 5; do [ -e /sys/class/net/eth0 ] && break; sleep 1; done
  ip link set eth0 up
  if [ "$IP" = dhcp ]; then
    udhcpc -i eth0 -n -q -t 10 -T 1 -s /etc/udhcpc.sh >/dev/null 2>&1 && echo "NET-UP eth0 dhcp $(ip -4 -o addr show eth0 | awk '{print $4}')"
  else
    ip addr add "$IP" dev eth0 && echo "NET-UP eth0 $IP"
  fi
fi
if [ -n "$ROOT" ] && mount -t ext4 -o ro $ROOT /mnt 2>/dev/null; then
  for u in /mnt/etc/systemd/system/multi-user.target.wants/salt-virt-*.service; do
    [ -e "$u" ] || [ -L "$u" ] || continue
    x=$(sed -n 's/^ExecStart=//p' "/mnt/etc/systemd/system/${u##*/}" | head -n1)
    s=${x##* }
    sh "/mnt$s"; echo "BOOT-HOOK: ${u##*/} rc=$?"
  done
  umount /mnt
fi
DATA=
if [ -x /usr/sbin/qemu-ga ]; then  # the initrd-qga.img variant: a read-write filesystem and the agent
  insmod /lib/mod/virtio_console.ko 2>/dev/null
  mkdir -p /data /var/run /dev/virtio-ports
  for i in $(seq 1 25); do ls /sys/class/virtio-ports/vport* >/dev/null 2>&1 && break; sleep 0.2; done
  for p in /sys/class/virtio-ports/vport*; do  # what udev's rule would link
    [ -f "$p/name" ] && ln -sf "/dev/${p##*/}" "/dev/virtio-ports/$(cat "$p/name")"
  done
  PORT=/dev/virtio-ports/org.qemu.guest_agent.0
  if [ -z "$ROOT" ]; then echo "QGA-FAILED: no ext4 disk to mount"
  elif ! mount -t ext4 $ROOT /data; then echo "QGA-FAILED: cannot mount $ROOT read-write"
  elif [ ! -e $PORT ]; then echo "QGA-FAILED: no $PORT (ports: $(ls /sys/class/virtio-ports 2>&1))"
  else
    /usr/sbin/qemu-ga -m virtio-serial -p $PORT -t /var/run >/tmp/qemu-ga.log 2>&1 &
    QGA=$!; sleep 1
    if kill -0 $QGA 2>/dev/null; then DATA=/data; echo "QGA-UP $ROOT on /data pid=$QGA"
    else echo "QGA-FAILED: qemu-ga exited: $(tr '\n' '|' < /tmp/qemu-ga.log)"; fi
  fi
fi
if [ "$MODE" = poweroff ]; then echo "GUEST-POWEROFF"; sync; poweroff -f; fi
n=0
# the beat waits on a fifo nobody writes (the shell's own read -t) instead of running sleep each second,
# which kept an idle TCG guest at 1.5% of a core (0.5% now, measured with qemu 7.2)
mkfifo /tmp/tick; exec 3<>/tmp/tick
while true; do [ -n "$DATA" ] && echo $n > $DATA/heartbeat; echo "HB $n"; n=$((n+1)); read -t 1 -u 3 _; done
INIT
chmod +x $R/init
cat > $R/etc/udhcpc.sh <<'DH'
#!/bin/sh
case "$1" in bound|renew) ip addr flush dev "$interface"; ip addr add "$ip/${mask:-24}" dev "$interface"
  [ -n "$router" ] && ip route add default via "${router%% *}" dev "$interface";; esac
DH
chmod +x $R/etc/udhcpc.sh
(cd $R && find . | ../bbx/bin/busybox cpio -o -H newc 2>/dev/null) | gzip -9 > "$OUT"/initrd.img.tmp

# The guest-agent variant: qemu-ga with the shared libraries (and loader) it links, taken from the host
# (the same Debian release: qemu-system-x86 depends on each of them).
mkdir -p $R/usr/sbin
cp qga/usr/sbin/qemu-ga $R/usr/sbin/qemu-ga
module virtio_console $R/lib/mod
libs=$(ldd qga/usr/sbin/qemu-ga) || { echo "build-guest: ldd qemu-ga failed: $libs" >&2; exit 1; }
if grep -q 'not found' <<<"$libs"; then echo "build-guest: qemu-ga needs libraries missing here: $libs" >&2; exit 1; fi
for lib in $(awk '/=> \//{print $3} /^\t\//{print $1}' <<<"$libs"); do
  mkdir -p "$R$(dirname "$lib")"
  cp -L "$lib" "$R$lib"
done
(cd $R && find . | ../bbx/bin/busybox cpio -o -H newc 2>/dev/null) | gzip -9 > "$OUT"/initrd-qga.img.tmp

# Root filesystem content, then an MBR disk with it in partition 1 (built without mounting anything).
mkdir -p fs/etc/salt fs/root
echo "base-image built $(date -u +%FT%TZ)" > fs/seed.txt
echo "salt-virt test guest" > fs/etc/issue
mkfs.ext4 -q -F -L root -d fs part.img 63M
truncate -s 64M disk.raw
printf 'label: dos\nstart=2048, type=83\n' | sfdisk -q disk.raw
dd if=part.img of=disk.raw bs=1M seek=1 conv=notrunc status=none
qemu-img convert -f raw -O qcow2 disk.raw disk.qcow2
mv disk.raw "$OUT"/disk.raw; mv disk.qcow2 "$OUT"/disk.qcow2

# A disk that boots on its own (a catalog image for the web console's test): extlinux from the MBR, the same
# kernel and initramfs, their text on the VGA screen too (/dev/console is the last console=) and DHCP.
mkdir -p boot/boot/extlinux
cp "$OUT"/vmlinuz.tmp boot/boot/vmlinuz; cp "$OUT"/initrd.img.tmp boot/boot/initrd.img
echo "boot image built $(date -u +%FT%TZ)" > boot/seed.txt
cat > boot/boot/extlinux/extlinux.conf <<'EXT'
DEFAULT guest
TIMEOUT 0
PROMPT 0
LABEL guest
  LINUX /boot/vmlinuz
  INITRD /boot/initrd.img
  APPEND console=ttyS0 console=tty0 guest.ip=dhcp
EXT
mkfs.ext4 -q -F -L root -b 4096 -O ^metadata_csum_seed -d boot bootpart.img 31M
truncate -s 32M boot.raw
printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q boot.raw
dd if=bootpart.img of=boot.raw bs=1M seek=1 conv=notrunc status=none
# extlinux writes its loader into a mounted filesystem only (scripts/build-debian-image.sh does the same)
LOOP=$(losetup -f --show -o $((2048 * 512)) boot.raw)
mkdir -p bootmnt
if mount "$LOOP" bootmnt; then
  extlinux --install bootmnt/boot/extlinux >/dev/null 2>&1 && rc=0 || rc=$?
  umount bootmnt
else rc=1; fi
losetup -d "$LOOP"
[ "$rc" = 0 ] || { echo "build-guest: extlinux --install failed on boot.raw" >&2; exit 1; }
dd if=/usr/lib/EXTLINUX/mbr.bin of=boot.raw conv=notrunc bs=440 count=1 status=none
qemu-img convert -f raw -O qcow2 boot.raw "$OUT"/boot.qcow2
mv "$OUT"/vmlinuz.tmp "$OUT"/vmlinuz; mv "$OUT"/vmlinux.tmp "$OUT"/vmlinux; mv "$OUT"/initrd.img.tmp "$OUT"/initrd.img
mv "$OUT"/initrd-qga.img.tmp "$OUT"/initrd-qga.img
chmod 644 "$OUT"/*
ls -la "$OUT" >&2
