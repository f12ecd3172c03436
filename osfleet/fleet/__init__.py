"""The fleet gateway: one endpoint, the host agent's contract, in front of many host agents."""
