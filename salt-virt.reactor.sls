{#-
  salt-virt.reactor.sls: when a hypervisor says it is ready, create the VMs the master's pillar assigns
  to it (salt-run virt.provision_assigned).

  Master config:
      reactor:
        - 'salt/virt/hypervisor/ready':
          - salt://salt-virt.reactor.sls     # or the absolute path of a copy of this file
  The hypervisor fires the event at the end of salt-virt.example.sls (pillar salt_virt:ready_event: True),
  or at any time with `salt-call virt.ready` (the event carries a nonce only that minion keeps).

  Trust: any minion, every VM included, can send this event with any tag and data (Salt's batch event
  form is not checked against the sender), so neither `data['id']` nor the tag proves who sent it. The
  runner therefore asks the named host, in a job only it answers (virt.ready_confirm), whether it sent
  this event's nonce, and does nothing otherwise. It also refuses a minion that is not in
  virt:hypervisors (master config), reads what to create from that host's pillar as the master compiles
  it (virt:assigned_vms), never from the event, and skips VMs that exist: firing twice creates nothing
  twice.
-#}
{%- if data.get('cmd') == '_minion_event' and data.get('id') %}
salt-virt-provision-assigned:
  runner.virt.provision_assigned:
    - args:
      - host: {{ data['id'] | json }}
      - ready_nonce: {{ (data.get('data') or {}).get('nonce') | json }}
{%- endif %}
