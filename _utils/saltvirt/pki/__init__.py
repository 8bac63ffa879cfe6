"""The libvirt PKI: CA, issuing, renewal, CRL, the TLS files on a hypervisor, sealed envelopes (layer 2).

``ca`` (the CA and certificates; ``python3 -m saltvirt.pki`` runs its command line), ``crl``, ``keyfiles``
(the ``virt.keys`` state's files) and ``envelope`` (secrets sealed to one minion's key, runner -> hypervisor).
Master side except ``keyfiles`` and the unseal half of ``envelope``. May import: ``base``.
"""
