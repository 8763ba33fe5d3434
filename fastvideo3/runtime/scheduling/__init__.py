"""scheduling: the planner, the dispatcher, the CoreScheduler that wires them, WorkUnit and the Executor protocol (see fastvideo3/runtime/__init__.py)."""
