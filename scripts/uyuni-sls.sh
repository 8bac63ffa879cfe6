#!/bin/bash
# Uyuni's (SUSE Manager's) virtualization SLS files and loader modules, for tests/integration/test_uyuni_real.py.
# Uyuni is GPL-2.0 and salt-virt Apache-2.0: the files stay out of this repository. This script fetches the
# versions the test was written against (each checked by its sha256) into
#   $SALT_VIRT_UYUNI (default /var/cache/salt-virt/uyuni/susemanager-sls), laid out as Uyuni's susemanager-sls.
# The test reads them from there and fetches nothing itself (no file there: it is skipped and says so).
# A file whose digest differs (Uyuni changed it) is not installed: the test is written for the pinned content.
set -euo pipefail
DEST=${SALT_VIRT_UYUNI:-${SALT_VIRT_CACHE:-/var/cache/salt-virt}/uyuni/susemanager-sls}
BASE=https://raw.githubusercontent.com/uyuni-project/uyuni
# <sha256> <commit holding that content, or a branch> <path under susemanager-utils/susemanager-sls>
FILES="
2def96080004a8cab24c7844685625598b5dad0047a5d4d3fdd4437f42fe3cb7 master salt/virt/create-vm.sls
99fe51ad9f6365c5bb5fc2bcb35f1b7f90a3ffac3d190f8faa6a7351bc1934e3 master salt/virt/update-vm.sls
431b1e24eafd843fa1a995281128768385f6f57abe4a8c2f1eca33ddcedb1106 2f7a3442af5835a4cb553ba3c52fdcc4641d943c salt/virt/deleted.sls
f9989c08a58d459b6a22cdffef529af30b6e9b01dc2d1ec1ecdb77b9b911b51f 80e4fce00d4120aa2e6be863c3350d9886e7ce18 salt/virt/statechange.sls
a0a332f48e1fe6f8a39bc8685da83ecb56918c6fb1660c9fc177b177623623b4 a4f11b7da087ded9686a08ab91525e07a1190d07 salt/virt/network-create.sls
d750da28b2ffbe8b8ffa7e9cac2945d5418e6e2d6299620ef38bedc2d735a7fd 3389e932794ac68fe0fc3e3ba7e4b85d32434e0d salt/virt/pool-create.sls
d56eda1aa70ac52d0917ae72cc65df923390e0a21128e22c053c49c531404c11 d4d5e0d7540fb31ac84441ce2a19d1d1e612ef4c salt/virt/pool-deleted.sls
41fa5c9cefe83328546b8459e490d1e7199dbdebc944c766faf2d385e2896047 0f84a47eba9c4da67591a7ee457601043b6fed47 salt/virt/volume-deleted.sls
c8abb3675b4be029c5029a16e2b01d89adb1c6cc999ab09e5fc04c7d6ad19ad0 58625872671120b9430b66757b039e87dbab6f34 salt/virt/network-statechange.sls
6864cf01a4a7c3482ed83669eeb8fe222808fc96cb0aed395572791369c015fa 06ae10b612daea23f460f7994991d09ab5cff92e salt/virt/pool-statechange.sls
19322899bca4072b9cc686ef6ba5383c5a2c072e88561cd870b2e5ae4c9e4400 a523dfc607471cea5a634b1e32da54b0ea695db4 salt/virt/pool-refreshed.sls
4b7c1a6f4cb58ec44432ca2232a4714db06d3f6c0180f442314b1da866117437 4b8c9c2e8c24a8e314dd9e35c500cdf20c2bde0a salt/virt/setmem.sls
6fdd34e698dcdf8680d6a16de29db359f3dc26e60a5897c26f35b08f26966ca9 d488fbca2ee59a22c6c3a7f4a7e55b39cfade656 salt/virt/setvcpus.sls
00a0ea8e2fa986a2828086055e87705e27ecacdbfd6330b3fe53caeb509aa0d8 54c3151828d435311e1ab249301849960824596b src/modules/virt_utils.py
9d0e7149b4d574631eb2a0c2e88b295ea90715472c0f66e54690de71301b0bdb b2ea45a469e7297ccc0437dbadee0235ecff57e9 src/states/virt_utils.py
9120e6901614633baebd23aa0ba82ffd877dac295cd8851671898637c4b54fe3 b2ea45a469e7297ccc0437dbadee0235ecff57e9 src/states/mgrcompat.py
"
log() { printf '[uyuni-sls] %s\n' "$*" >&2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
while read -r sum ref path; do
  [ -n "$path" ] || continue
  if [ -f "$DEST/$path" ] && echo "$sum  $DEST/$path" | sha256sum -c --status; then
    continue
  fi
  rc=0
  curl -fsSL --connect-timeout 10 --max-time 60 -o "$tmp/file" "$BASE/$ref/susemanager-utils/susemanager-sls/$path" || rc=$?
  case $rc in
    0) ;;
    6|7|28) log "no connection to $BASE (curl exit $rc): not fetching the rest"; exit 1 ;;
    *) log "could not fetch $path ($ref, curl exit $rc)"; status=1; continue ;;
  esac
  if ! echo "$sum  $tmp/file" | sha256sum -c --status; then
    log "$path at $ref is not the pinned content (sha256 $sum): not installed"; status=1; continue
  fi
  mkdir -p "$DEST/$(dirname "$path")"
  mv "$tmp/file" "$DEST/$path"
  log "$path"
done <<< "$FILES"
exit $status
