"""Gymnasium environments over an osfleet host agent or gateway; importing this module registers them.

    import gymnasium as gym
    import osfleet.gym  # registers osfleet/Desktop-v0

    env = gym.make("osfleet/Desktop-v0", url="http://127.0.0.1:8080", token=TOKEN, task="cli-write-note")
    envs = gym.make_vec("osfleet/Desktop-v0", num_envs=8, vectorization_mode="vector_entry_point", url=..., ...)

A desktop is nondeterministic (clocks, timing of the guest), so the spec says so.
"""

from __future__ import annotations

import gymnasium

from osfleet.gym.env import DesktopEnv, DesktopEnvError, DesktopInfrastructureError, InvalidDesktopAction
from osfleet.gym.vector import DesktopVectorEnv

ENV_ID = "osfleet/Desktop-v0"
"""The id ``gymnasium.make`` takes for ``DesktopEnv`` (and ``gymnasium.make_vec`` for ``DesktopVectorEnv``)."""

if ENV_ID not in gymnasium.registry:
    gymnasium.register(
        id=ENV_ID,
        entry_point="osfleet.gym.env:DesktopEnv",
        vector_entry_point="osfleet.gym.vector:DesktopVectorEnv",
        nondeterministic=True,
        disable_env_checker=False,
    )

__all__ = [
    "ENV_ID",
    "DesktopEnv",
    "DesktopEnvError",
    "DesktopInfrastructureError",
    "DesktopVectorEnv",
    "InvalidDesktopAction",
]
