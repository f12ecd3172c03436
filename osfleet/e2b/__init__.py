"""``osfleet e2b serve``: the E2B SDKs (``e2b``, ``e2b-desktop``) drive osfleet desktops unchanged.

E2B's SDK talks to two planes, and this server answers both on one port: the control plane (``POST
/v2/sandboxes`` and the rest, ``sandboxes`` and ``control``) and the daemon in every sandbox, "envd" (Connect RPC
``process.Process`` and ``filesystem.Filesystem``, ``GET/POST /files``; ``envd``). A sandbox is a lease of the fleet
taken with the client's own fleet token (its ``E2B_API_KEY``); e2b-desktop's shell lines (screenshots, xdotool,
its Xvfb and desktop start-up) are answered with the fleet's own capture and input (``desktop_lines``), every
other command runs in the guest as the desktop user (``guest_commands``).
"""
