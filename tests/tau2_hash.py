"""Prints tau2-bench's DB hash of each airline database file named on the
command line, one per line, computed by tau2's own pydantic data model
(reference/data_model.py of the data directory given first).

tau2's module imports a few `tau2.*` names; tiny stand-ins for them are
written to a temporary package so the data model file runs unchanged.
"""

import hashlib
import json
import os
import shutil
import sys
import tempfile

SHIMS = {
    "tau2/__init__.py": "",
    "tau2/domains/__init__.py": "",
    "tau2/domains/airline/__init__.py": "",
    "tau2/domains/airline/utils.py": "AIRLINE_DB_PATH = None\n",
    "tau2/environment/__init__.py": "",
    # tau2's DB: a pydantic model that forbids unknown fields.
    "tau2/environment/db.py": (
        "from pydantic import BaseModel, ConfigDict\n"
        "class DB(BaseModel):\n"
        "    model_config = ConfigDict(extra='forbid')\n"
    ),
}


def main():
    data_dir, files = sys.argv[1], sys.argv[2:]
    root = tempfile.mkdtemp()
    try:
        for path, text in SHIMS.items():
            full = os.path.join(root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)
        shutil.copy(
            os.path.join(data_dir, "reference", "data_model.py"),
            os.path.join(root, "tau2/domains/airline/data_model.py"),
        )
        sys.path.insert(0, root)
        from tau2.domains.airline.data_model import FlightDB

        for path in files:
            with open(path) as f:
                db = FlightDB.model_validate(json.load(f))
            text = json.dumps(db.model_dump(), sort_keys=True, default=str)
            print(hashlib.sha256(text.encode()).hexdigest())
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
