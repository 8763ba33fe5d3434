"""``python -m fleet.dynamo --scheduler HOST:PORT ...`` (see fleet/dynamo/README.md)."""
from fleet.dynamo.main import main

if __name__ == "__main__":
    main()
