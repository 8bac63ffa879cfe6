# -*- coding: utf-8 -*-
# vim: ft=sls

include:
  - .extra.clean
  - .qemu.clean
  - .server.clean
  - .python.clean
