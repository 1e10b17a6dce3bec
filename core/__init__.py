"""The shared vocabulary of wansync, pure: plan types and their validation, traffic classes, compute
draws, and the policies both the live scheduler and the simulator run. It imports nothing else of
the project, so agents, the overlay, the simulator and the scheduler can all depend on it."""
