{#-
  salt-virt.example.sls: turn a bare Debian/Ubuntu or RHEL-family machine into a salt-virt hypervisor.

  Copy it into your file_roots (e.g. as hypervisor.sls) and apply it to new hosts:
      salt 'hyper*' state.apply hypervisor
  First list the host's minion id in the master config (virt:hypervisors: [hyper1, ...], or a glob
  or nodegroup on ids): that, not a grain, makes it a hypervisor. Afterwards the libvirt ext_pillar
  hands it TLS certificates and the CRL, libvirtd listens for TLS and admits only hypervisor client
  certificates (tls_allowed_dn_list, crl_file), and `salt-run virt.init` can place VMs on it.

  Pillar (all optional):
    salt_virt:
      libvirtd_conf: /etc/libvirt/libvirtd.conf
      libvirtd_defaults: /etc/default/libvirtd   # RedHat: /etc/sysconfig/libvirtd (hosts without systemd)
      pki_basepath: /etc/pki
      listen_tcp: False            # plain TCP (no auth) only for labs
      bridge: br0
      bridge_uplink: eth0          # enslave this NIC to the bridge (omit: a bridge without uplink).
                                   # The host's address must then live on the bridge: configure that
                                   # (persistently) with the distribution's network tooling first.
      manage_service: True         # False: packages, config and keys only (e.g. in a container)
      lockspace: /srv/vms/.lockspace   # a directory on the storage every hypervisor shares: libvirt's lock
                                   # manager (virtlockd) keeps a lease per disk there, so QEMU never opens
                                   # a disk another host runs (the last guard of virt.recover). Enable it
                                   # on every hypervisor before VMs run (running ones hold no lease)
      qemu_conf: /etc/libvirt/qemu.conf
      qemu_lockd_conf: /etc/libvirt/qemu-lockd.conf
      ready_event: False           # True: at the end, fire salt/virt/hypervisor/ready to the master (with
                                   # salt-virt.reactor.sls the master then creates the VMs its pillar
                                   # assigns to this host: virt:assigned_vms)

  Listening for TLS: with systemd, libvirtd is socket activated and libvirtd-tls.socket (port 16514)
  is enabled; without systemd, libvirtd is started with --listen (LIBVIRTD_ARGS in libvirtd_defaults).
  The certificates come from the libvirt ext_pillar through virt.keys (CA, server and client).
  Hosts that run libvirt's modular daemons (virtqemud, RHEL 9 / Fedora default) need libvirtd enabled
  instead of them, or virtproxyd-tls.socket with the same certificates.
-#}
{%- set cfg = salt['pillar.get']('salt_virt', {}) %}
{%- set family = grains['os_family'] %}
{%- set packages = {
      'Debian': ['libvirt-daemon-system', 'libvirt-clients', 'qemu-system-x86', 'qemu-utils', 'python3-libvirt', 'gnutls-bin', 'iproute2', 'xorriso'],
      'RedHat': ['libvirt', 'libvirt-client', 'qemu-kvm', 'qemu-img', 'python3-libvirt', 'gnutls-utils', 'iproute', 'xorriso'],
    }.get(family, []) %}
{%- set conf = cfg.get('libvirtd_conf', '/etc/libvirt/libvirtd.conf') %}
{%- set defaults = cfg.get('libvirtd_defaults', '/etc/sysconfig/libvirtd' if family == 'RedHat' else '/etc/default/libvirtd') %}
{%- set pki = cfg.get('pki_basepath', '/etc/pki') %}
{%- set bridge = cfg.get('bridge', 'br0') %}
{%- set uplink = cfg.get('bridge_uplink') %}
{%- set systemd = grains.get('init') == 'systemd' %}
{%- set lockspace = cfg.get('lockspace') %}

{%- if not packages %}
salt-virt-unsupported-os:
  test.fail_without_changes:
    - name: "salt-virt.example supports os_family Debian and RedHat, not {{ family }}"
{%- endif %}

salt-virt-packages:
  pkg.installed:
    - pkgs: {{ packages | json }}

# the grains and the pillar afresh once libvirt is installed (the libvirt pillar of a host listed in
# the master's virt:hypervisors carries its certificates)
salt-virt-refresh-grains:
  module.run:
    - saltutil.refresh_grains:
      - refresh_pillar: True
    - onchanges:
      - pkg: salt-virt-packages

salt-virt-libvirtd-listen:
  file.keyvalue:
    - name: {{ conf }}
    - separator: ' = '
    - uncomment: '#'
    - append_if_not_found: True
    - key_values:
        listen_tls: '1'
        listen_tcp: '{{ 1 if cfg.get('listen_tcp') else 0 }}'
        ca_file: '"{{ pki }}/CA/cacert.pem"'
        cert_file: '"{{ pki }}/libvirt/servercert.pem"'
        key_file: '"{{ pki }}/libvirt/private/serverkey.pem"'
    - require:
      - pkg: salt-virt-packages

{%- if not systemd %}

# no socket activation: libvirtd itself opens the TCP/TLS sockets when started with --listen
salt-virt-libvirtd-args:
  file.keyvalue:
    - name: {{ defaults }}
    - separator: '='
    - append_if_not_found: True
    - key_values:
        LIBVIRTD_ARGS: '"--listen"'
    - require:
      - pkg: salt-virt-packages
{%- endif %}

# certificates, keys and the CRL; in libvirtd.conf: crl_file and a tls_allowed_dn_list that admits
# only hypervisor client certificates (not QEMU's migration pair, not anything else the CA signed).
# qemu: QEMU's own pair in <pki>/qemu, so migrations encrypt the VM's memory and disks (qemu.conf's
# default_tls_x509_cert_dir is /etc/pki/qemu: with another pki_basepath, point it and the minion's
# virt:migration:qemu_tls_dir there)
salt-virt-keys:
  virt.keys:
    - basepath: {{ pki }}
    - qemu: True
    - libvirtd_conf: {{ conf }}
    - require:
      - file: salt-virt-libvirtd-listen
      - pkg: salt-virt-packages
      - module: salt-virt-refresh-grains

{%- if cfg.get('manage_service', True) %}
{%- if systemd %}
salt-virt-libvirtd-tls-socket:
  service.running:
    - name: libvirtd-tls.socket
    - enable: True
    - require:
      - virt: salt-virt-keys
{%- endif %}

salt-virt-libvirtd:
  service.running:
    - name: libvirtd
    - enable: True
    - watch:
      - file: salt-virt-libvirtd-listen
      - virt: salt-virt-keys
{%- if lockspace %}
      - file: salt-virt-lock-manager
{%- endif %}
{%- if systemd %}
    - require:
      - service: salt-virt-libvirtd-tls-socket
{%- else %}
      - file: salt-virt-libvirtd-args
{%- endif %}
{%- endif %}

{%- if lockspace %}

# libvirt's lock manager with a lockspace on the shared storage: a disk leased by one host's virtlockd
# cannot be opened by QEMU on another (one VM never runs twice, whatever a controller believes)
salt-virt-lockspace:
  file.directory:
    - name: {{ lockspace }}
    - mode: '0700'
    - makedirs: True

salt-virt-lockd:
  file.keyvalue:
    - name: {{ cfg.get('qemu_lockd_conf', '/etc/libvirt/qemu-lockd.conf') }}
    - separator: ' = '
    - uncomment: '#'
    - append_if_not_found: True
    - key_values:
        auto_disk_leases: '1'
        require_lease_for_disks: '1'
        file_lockspace_dir: '"{{ lockspace }}"'
    - require:
      - pkg: salt-virt-packages
      - file: salt-virt-lockspace

salt-virt-lock-manager:
  file.keyvalue:
    - name: {{ cfg.get('qemu_conf', '/etc/libvirt/qemu.conf') }}
    - separator: ' = '
    - uncomment: '#'
    - append_if_not_found: True
    - key_values:
        lock_manager: '"lockd"'
    - require:
      - file: salt-virt-lockd
{%- if cfg.get('manage_service', True) %}

salt-virt-virtlockd:
  service.running:
    - name: virtlockd
    - enable: True
    - require:
      - file: salt-virt-lockd
    - require_in:
      - service: salt-virt-libvirtd
{%- endif %}
{%- endif %}

salt-virt-bridge:
  cmd.run:
    - name: ip link add {{ bridge }} type bridge && ip link set {{ bridge }} up
    - unless: ip link show {{ bridge }}
    - require:
      - pkg: salt-virt-packages
{%- if uplink %}

salt-virt-bridge-uplink:
  cmd.run:
    - name: ip link set {{ uplink }} master {{ bridge }} && ip link set {{ uplink }} up
    - unless: test "$(basename "$(readlink /sys/class/net/{{ uplink }}/master 2>/dev/null)")" = {{ bridge }}
    - require:
      - cmd: salt-virt-bridge
{%- endif %}
{%- if cfg.get('ready_event') %}

# the last step: tell the master this hypervisor is ready (salt-virt.reactor.sls reacts to it)
salt-virt-ready:
  module.run:
    - virt.ready: []
    - require:
      - virt: salt-virt-keys
      - cmd: salt-virt-bridge
{%- if uplink %}
      - cmd: salt-virt-bridge-uplink
{%- endif %}
{%- if cfg.get('manage_service', True) %}
      - service: salt-virt-libvirtd
{%- endif %}
{%- endif %}
