"""OpenEnv (openenv-core) adapter: osfleet desktops served as an OpenEnv environment."""
