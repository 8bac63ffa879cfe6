"""The libvirt PKI: CA, issuing, renewal, CRL, the TLS files on a hypervisor, sealed envelopes (layer 2).

Bottom up: ``castore`` (the clock, private files and locks the CA and its CRL share), ``crl`` (the revocation
list, kept given the CA's certificate and key), ``ca`` (the CA and certificates; ``python3 -m saltvirt.pki``
runs its command line), ``revocation`` (one ca_dir's CRL, retiring former hypervisors), ``keyfiles`` (the
``virt.keys`` state's files) and ``envelope`` (secrets sealed to one minion's key, runner -> hypervisor).
Master side except ``keyfiles`` and the unseal half of ``envelope``. May import: ``base``.
"""
