"""Tasks: initial state (set-up), instruction, verifier criteria checked in the guest, oracle actions."""
