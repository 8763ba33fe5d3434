"""``python -m services.scheduler --port P --card NAME --pools ROLE=HOST:PORT ... | --config fleet.yaml``."""
import sys

from services.scheduler.app import run_scheduler

if __name__ == "__main__":
    sys.exit(run_scheduler())
