"""Reading the JSON that `ordo bench --json` writes, for the table scripts
(nofs_tables.py, ccfs_tables.py, optfs_fig8.py)."""
import json


def load(path):
    """The report at `path`, or None when it is missing or not JSON (a run
    that did not happen is a row the tables mark, not an error)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
