"""The SARIF 2.1.0 JSON Schema, fetched from a package registry, never kept in the repository.

No Python package ships the schema; the npm package ``@microsoft/jest-sarif`` does
(``lib/schemas/sarif-2.1.0-rtm.5.json``, the SchemaStore copy of SARIF 2.1.0). It is
fetched once with ``npm pack`` into ``~/.cache/gpudoctor-tests`` (or the folder named by
``GPUDOCTOR_TEST_CACHE``); ``GPUDOCTOR_SARIF_SCHEMA`` may point at a schema file
instead. Where neither npm nor the registry is reachable, the tests that need it skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

PACKAGE = "@microsoft/jest-sarif@1.0.0-beta.0"
MEMBER = "package/lib/schemas/sarif-2.1.0-rtm.5.json"


def sarif_schema_path() -> tuple[Path | None, str]:
    """(path, "") when the schema is at hand, else (None, why not)."""
    env = os.environ.get("GPUDOCTOR_SARIF_SCHEMA")
    if env:
        p = Path(env)
        return (p, "") if p.is_file() else (None, f"GPUDOCTOR_SARIF_SCHEMA={env} does not exist")
    cache = Path(os.environ.get("GPUDOCTOR_TEST_CACHE", Path.home() / ".cache" / "gpudoctor-tests"))
    target = cache / "sarif-2.1.0-rtm.5.json"
    if target.is_file():
        return target, ""
    npm = shutil.which("npm")
    if npm is None:
        return None, "npm is not installed, so the SARIF 2.1.0 schema cannot be fetched"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            done = subprocess.run(
                [npm, "pack", PACKAGE, "--silent"], cwd=tmp, capture_output=True, text=True, timeout=120
            )
        except subprocess.TimeoutExpired:
            return None, "npm pack timed out fetching the SARIF 2.1.0 schema"
        tarballs = list(Path(tmp).glob("*.tgz"))
        if done.returncode != 0 or not tarballs:
            return None, f"npm pack {PACKAGE} failed: {done.stderr.strip()[-200:]}"
        with tarfile.open(tarballs[0]) as tar:
            data = tar.extractfile(MEMBER)
            if data is None:
                return None, f"{PACKAGE} has no {MEMBER}"
            cache.mkdir(parents=True, exist_ok=True)
            part = target.with_suffix(".part")
            part.write_bytes(data.read())
            part.replace(target)
    return target, ""
