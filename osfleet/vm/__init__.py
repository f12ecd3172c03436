"""The host's hypervisor primitives: everything that drives libvirt, QEMU and replica disks on one host.

Kept apart from the measurement helpers (``osfleet.measure``) and the cross-cutting modules left at the top of
``osfleet`` (settings, errors, TLS, the command line's support) so that the bottom layer of the import graph
reads as what it is: a host that boots VMs from golden images. Only ``virt`` talks to libvirt; the replica
library (``osfleet.replicas``) builds on these modules and nothing here imports it back.
"""
