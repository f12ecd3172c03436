"""Replicas on one host: libvirt domains on copy-on-write overlays, their records, resets and warm pool."""
