{#-
  salt-virt.reactor.sls: when a hypervisor says it is ready, create the VMs the master's pillar assigns
  to it (salt-run virt.provision_assigned).

  Master config:
      reactor:
        - 'salt/virt/hypervisor/ready':
          - salt://salt-virt.reactor.sls     # or the absolute path of a copy of this file
  The hypervisor fires the event at the end of salt-virt.example.sls (pillar salt_virt:ready_event: True),
  or at any time with `salt-call event.send salt/virt/hypervisor/ready`.

  Trust: any minion, every VM included, can send this event with any data. So only `data['id']` is
  used: the minion id the master authenticated the sender as (not the tag, not the event's data; keep
  the master's default minimum_auth_version: 3), and only for events a minion sent (cmd _minion_event). The runner then refuses a minion that is not in
  virt:hypervisors (master config), reads what to create from that host's pillar as the master compiles
  it (virt:assigned_vms), never from the event, and skips VMs that exist: firing twice creates nothing
  twice.
-#}
{%- if data.get('cmd') == '_minion_event' and data.get('id') %}
salt-virt-provision-assigned:
  runner.virt.provision_assigned:
    - args:
      - host: {{ data['id'] | json }}
{%- endif %}
