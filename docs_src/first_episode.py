"""One episode on the local host agent: lease a desktop, reset it to a task, act, score, release."""

from osfleet.client import Fleet

with (
    Fleet("http://127.0.0.1:8080", token_file="/var/lib/osfleet/api-token") as fleet,
    fleet.lease() as desktop,  # released at the end of the block, whatever happens
):
    start = desktop.reset("cli-write-note")  # a built-in task
    print(start.instruction)
    start.screen.image().save("before.png")  # what an agent would look at
    desktop.step(
        [
            {"type": "click", "x": 200, "y": 200},  # focus the terminal
            {"type": "type", "text": "mkdir -p ~/notes && echo 'buy milk' > ~/notes/todo.txt\n"},
            {"type": "wait", "seconds": 1},
        ]
    )
    result = desktop.evaluate()  # the task's verifier, run by the host
    print(f"reward {result.reward}, success {result.success}")
