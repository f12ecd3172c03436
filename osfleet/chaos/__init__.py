"""Fault injection against a running fleet (``osfleet chaos``): each fault by its own real mechanism."""

from osfleet.chaos.faults import KINDS, ActiveFaults, Fault, FaultError, heal
from osfleet.chaos.hosts import ChaosHost, lab_hosts, local_host, resolve
from osfleet.chaos.runner import ChaosPlan, ChaosRunner, FaultSpec

__all__ = [
    "KINDS",
    "ActiveFaults",
    "ChaosHost",
    "ChaosPlan",
    "ChaosRunner",
    "Fault",
    "FaultError",
    "FaultSpec",
    "heal",
    "lab_hosts",
    "local_host",
    "resolve",
]
