"""An OpenAI-compatible Videos API (job style: create, poll, download) and a playground page in
front of a fleet's scheduler. ``python -m fleet.gateway --scheduler HOST:PORT``; see app.py."""
