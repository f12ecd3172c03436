"""E2B's desktop SDK on an osfleet desktop, unchanged: only the environment points it at `osfleet e2b serve`.

osfleet e2b serve --url http://127.0.0.1:8080 --port 3000 &
export E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:3000
export E2B_API_KEY=...   # a client token of the fleet
python examples/e2b_write_note.py
"""

from e2b_desktop import Sandbox

with Sandbox.create(timeout=300) as desktop:  # a desktop of the fleet, leased for this key
    with open("screen.png", "wb") as f:
        f.write(desktop.screenshot())
    desktop.left_click(200, 200)  # the terminal
    desktop.write("mkdir -p ~/notes && echo 'buy milk' > ~/notes/todo.txt")
    desktop.press("enter")
    desktop.wait(2000)
    print(desktop.commands.run("cat ~/notes/todo.txt").stdout, end="")  # in the desktop, as its user
# leaving the block kills the sandbox: the desktop goes back to the fleet
