# -*- coding: utf-8 -*-
# vim: ft=sls

include:
  - .package
  - .config
  - .service
  - .tls
