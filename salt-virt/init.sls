{#-
  salt-virt (formula): turn a bare Debian/Ubuntu, RHEL-family/Fedora or SUSE (SLES, openSUSE Leap and
  Tumbleweed) machine into a salt-virt hypervisor.

  Put this folder (salt-virt/: init.sls, map.jinja, pillar.example) at the top of a file_roots entry and
  apply it to new hosts:
      salt 'hyper*' state.apply salt-virt
  (salt-virt.example.sls, which older setups copy as e.g. hypervisor.sls, includes it.)
  First list the host's minion id in the master config (virt:hypervisors: [hyper1, ...], or a glob
  or nodegroup on ids): that, not a grain, makes it a hypervisor. Afterwards the libvirt ext_pillar
  hands it TLS certificates and the CRL, libvirt listens for TLS and admits only hypervisor client
  certificates (tls_allowed_dn_list, crl_file), and `salt-run virt.init` can place VMs on it.

  Pillar salt_virt (all optional; pillar.example lists every key): the settings, and salt_virt:lookup to
  override what map.jinja knows of the distribution (packages, daemons, files).

  The daemons (map.jinja): where the distribution runs libvirt's modular daemons by default (EL 9+,
  Fedora, SLES 15 SP6+, Leap 15.6+, Tumbleweed) virtqemud and its peers run, virtproxyd listens for
  TLS (its config: /etc/libvirt/virtproxyd.conf) and the monolithic libvirtd is stopped and disabled
  (it holds the same sockets); elsewhere libvirtd does it all (/etc/libvirt/libvirtd.conf).
  salt_virt:lookup:modular: True or False chooses instead.

  Listening for TLS: with systemd, the daemon is socket activated and <daemon>-tls.socket (port 16514)
  is enabled; without systemd, it is started with --listen (<DAEMON>_ARGS in libvirtd_defaults).
  The certificates come from the libvirt ext_pillar through virt.keys (CA, server and client).
-#}
{%- from tpldir ~ "/map.jinja" import hv with context %}
{%- set systemd = grains.get('init') == 'systemd' %}
{%- set conf = hv.libvirtd_conf %}
{%- set pki = hv.pki_basepath %}
{%- set bridge = hv.bridge %}
{%- set uplink = hv.bridge_uplink %}
{%- set lockspace = hv.lockspace %}
{%- set manage_service = hv.manage_service %}
{#- the state that runs the QEMU driver: restarted for the lock manager, needs virtlockd first #}
{%- set qemu_state = 'salt-virt-libvirtd' if hv.qemu_service == hv.libvirtd_service else 'salt-virt-' ~ hv.qemu_service %}

{%- if not hv.pkgs %}
salt-virt-unsupported-os:
  test.fail_without_changes:
    - name: "salt-virt supports os_family Debian, RedHat and Suse, not {{ grains.get('os_family') }} (or set salt_virt:lookup:pkgs)"
{%- endif %}

salt-virt-packages:
  pkg.installed:
    - pkgs: {{ hv.pkgs | json }}

# the grains and the pillar afresh once libvirt is installed (the libvirt pillar of a host listed in
# the master's virt:hypervisors carries its certificates)
salt-virt-refresh-grains:
  module.run:
    - saltutil.refresh_grains:
      - refresh_pillar: True
    - onchanges:
      - pkg: salt-virt-packages
{%- if conf %}

salt-virt-libvirtd-listen:
  file.keyvalue:
    - name: {{ conf }}
    - separator: ' = '
    - uncomment: '#'
    - append_if_not_found: True
    - key_values:
        listen_tls: '1'
        listen_tcp: '{{ 1 if hv.listen_tcp else 0 }}'
        ca_file: '"{{ pki }}/CA/cacert.pem"'
        cert_file: '"{{ pki }}/libvirt/servercert.pem"'
        key_file: '"{{ pki }}/libvirt/private/serverkey.pem"'
    - require:
      - pkg: salt-virt-packages
{%- endif %}
{%- if not systemd and hv.libvirtd_defaults %}

# no socket activation: the daemon itself opens the TCP/TLS sockets when started with --listen
salt-virt-libvirtd-args:
  file.keyvalue:
    - name: {{ hv.libvirtd_defaults }}
    - separator: '='
    - append_if_not_found: True
    - key_values:
        {{ hv.libvirtd_service | upper }}_ARGS: '"--listen"'
    - require:
      - pkg: salt-virt-packages
{%- endif %}

# certificates, keys and the CRL; in the daemon's config: crl_file and a tls_allowed_dn_list that admits
# only hypervisor client certificates (not QEMU's migration pair, not anything else the CA signed).
# qemu: QEMU's own pair in <pki>/qemu, so migrations encrypt the VM's memory and disks (qemu.conf's
# default_tls_x509_cert_dir is /etc/pki/qemu: with another pki_basepath, point it and the minion's
# virt:migration:qemu_tls_dir there)
salt-virt-keys:
  virt.keys:
    - basepath: {{ pki }}
    - qemu: True
    - libvirtd_conf: {{ (conf or False) | json }}
    - require:
{%- if conf %}
      - file: salt-virt-libvirtd-listen
{%- endif %}
      - pkg: salt-virt-packages
      - module: salt-virt-refresh-grains

{%- if manage_service %}
{%- if hv.modular %}

# the monolithic libvirtd holds the sockets the modular daemons open: off, as libvirt's switch to them says
salt-virt-libvirtd-monolithic-off:
  service.dead:
    - names: {{ (['libvirtd.service', 'libvirtd.socket', 'libvirtd-ro.socket', 'libvirtd-admin.socket', 'libvirtd-tcp.socket', 'libvirtd-tls.socket'] if systemd else ['libvirtd']) | json }}
    - enable: False
    - require:
      - pkg: salt-virt-packages
{%- endif %}
{%- for daemon in hv.daemons %}

salt-virt-{{ daemon }}:
  service.running:
    - name: {{ daemon }}
    - enable: True
    - require:
      - pkg: salt-virt-packages
{%- if hv.modular %}
      - service: salt-virt-libvirtd-monolithic-off
{%- endif %}
{%- if lockspace and daemon == hv.qemu_service %}
    - watch:
      - file: salt-virt-lock-manager
{%- endif %}
{%- endfor %}
{%- if systemd %}

salt-virt-libvirtd-tls-socket:
  service.running:
    - name: {{ hv.libvirtd_tls_socket }}
    - enable: True
    - require:
      - virt: salt-virt-keys
{%- if hv.modular %}
      - service: salt-virt-libvirtd-monolithic-off
{%- endif %}
{%- endif %}

salt-virt-libvirtd:
  service.running:
    - name: {{ hv.libvirtd_service }}
    - enable: True
    - watch:
{%- if conf %}
      - file: salt-virt-libvirtd-listen
{%- endif %}
      - virt: salt-virt-keys
{%- if lockspace and qemu_state == 'salt-virt-libvirtd' %}
      - file: salt-virt-lock-manager
{%- endif %}
{%- if not systemd and hv.libvirtd_defaults %}
      - file: salt-virt-libvirtd-args
{%- endif %}
{%- if systemd or hv.daemons %}
    - require:
{%- if systemd %}
      - service: salt-virt-libvirtd-tls-socket
{%- endif %}
{%- for daemon in hv.daemons %}
      - service: salt-virt-{{ daemon }}
{%- endfor %}
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
    - name: {{ hv.qemu_lockd_conf }}
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
    - name: {{ hv.qemu_conf }}
    - separator: ' = '
    - uncomment: '#'
    - append_if_not_found: True
    - key_values:
        lock_manager: '"lockd"'
    - require:
      - file: salt-virt-lockd
{%- if manage_service %}

salt-virt-virtlockd:
  service.running:
    - name: virtlockd
    - enable: True
    - require:
      - file: salt-virt-lockd
    - require_in:
      - service: {{ qemu_state }}
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
{%- if hv.ready_event %}

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
{%- if manage_service %}
      - service: salt-virt-libvirtd
{%- if qemu_state != 'salt-virt-libvirtd' %}
      - service: {{ qemu_state }}
{%- endif %}
{%- endif %}
{%- endif %}
