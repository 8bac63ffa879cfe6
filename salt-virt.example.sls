{#-
  salt-virt.example.sls: turn a bare Debian/Ubuntu, RHEL-family/Fedora or SUSE machine into a salt-virt
  hypervisor. It includes the salt-virt formula, the folder salt-virt/ beside this file (init.sls: what it
  does; map.jinja: per distribution; pillar.example: every pillar key, salt_virt:...): keep both in your
  file_roots. Copied as e.g. hypervisor.sls:
      salt 'hyper*' state.apply hypervisor
  which is the same as applying the formula itself:
      salt 'hyper*' state.apply salt-virt
-#}
include:
  - salt-virt
