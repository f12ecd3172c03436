"""Fabric tasks that build golden desktop images and provision replica disks on KVM hosts."""
