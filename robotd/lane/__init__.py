"""The lane between the main process and the control process: typed messages and their codec."""
