"""Measurement helpers shared by the benchmarks, the report and the capacity plan: one percentile and unit
spelling, per-request stage timing, the facts of the machine a figure was taken on, and the one cost model.

They sit in the bottom layer, apart from the host's primitives (``osfleet.vm``), because the host agent and the
replica library time their own stages with ``timing`` too; nothing here drives a VM.
"""
