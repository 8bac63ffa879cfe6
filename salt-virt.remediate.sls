{#-
  salt-virt.remediate.sls: the remediation reactors. Each maps an event to salt-run virt.remediate with the
  event's hints only (the host's minion id, the VM's name and UUID); the runner decides. Every kind is off
  until virt:remediate:<kind>:enabled: True in the master config (docs/topics/remediation.md).

  Master config:
      reactor:
        - 'salt/virt/*/domain/*/crashed':            # QEMU died or the guest crashed: restart, backoff, move
          - salt://salt-virt.remediate.sls           # or the absolute path of a copy of this file
        - 'salt/virt/*/domain/*/panicked':
          - salt://salt-virt.remediate.sls
        - 'salt/virt/*/domain/*/io_error':           # a disk error (ENOSPC): kept paused, alerted
          - salt://salt-virt.remediate.sls
        - 'salt/virt/*/domain/*/agent_*':            # the guest agent: reset after a long silence
          - salt://salt-virt.remediate.sls
        - 'salt/beacon/*/memusage/':                 # a hypervisor's beacon: one balancing round
          - salt://salt-virt.remediate.sls
        - 'salt/beacon/*/diskusage/':
          - salt://salt-virt.remediate.sls

  Trust: any minion, every VM included, can send these events with any tag and data (Salt's batch event form is
  not checked against the sender), so nothing here is a fact. The runner acts only for a host in
  virt:hypervisors, asks that host in a job only it answers (signed with its key) what state the VM is in,
  and acts on that answer only: a forged event changes nothing.
-#}
{%- set event = tag.split('/')[-1] %}
{%- set kinds = {'crashed': 'crashed', 'panicked': 'crashed', 'io_error': 'io_error',
                 'agent_disconnected': 'agent', 'agent_connected': 'agent'} %}
{%- set body = data.get('data') if data.get('data') is mapping else {} %}
{%- if tag.startswith('salt/virt/') and event in kinds and data.get('cmd') == '_minion_event' and data.get('id')
      and body.get('name') %}
salt-virt-remediate-{{ kinds[event] }}:
  runner.virt.remediate:
    - args:
      - kind: {{ kinds[event] | json }}
      - host: {{ data['id'] | json }}
      - name: {{ body['name'] | json }}
      - uuid: {{ body.get('uuid') | json }}
{%- elif tag.startswith('salt/beacon/') and data.get('id') %}
salt-virt-remediate-beacon:
  runner.virt.remediate:
    - args:
      - kind: beacon
      - host: {{ data['id'] | json }}
{%- endif %}
