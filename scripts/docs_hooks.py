"""MkDocs hooks (mkdocs.yml ``hooks:``): the REST API's OpenAPI schema in the site.

At each build the schema is generated from the code, as a node would serve it at
``/api/schema/`` (``manage.py spectacular``, on the embedded defaults in a throw-away data
folder: no node, no database, no network), added to the site as ``reference/openapi.yaml``,
and its operations listed in ``reference/rest-api.md`` where the page says
``<!-- openapi-operations -->``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parent.parent
SCHEMA_URI = "reference/openapi.yaml"
MARKER = "<!-- openapi-operations -->"
METHODS = ("get", "post", "put", "patch", "delete")

_work = tempfile.TemporaryDirectory(prefix="mq-docs-")
_schema: dict[str, Any] = {}


def _generate() -> Path:
    out = Path(_work.name) / "openapi.yaml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "KV_", "REDIS_", "MQ_"))}
    env.update(MQ_DATA_DIR=str(Path(_work.name) / "data"), DJANGO_SETTINGS_MODULE="config.settings")
    subprocess.run(
        [sys.executable, "manage.py", "spectacular", "--file", str(out), "--validate", "--fail-on-warn"],
        cwd=REPO,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return out


def on_files(files: Files, config: Any) -> Files:
    path = _generate()
    _schema.clear()
    _schema.update(yaml.safe_load(path.read_text()))
    files.append(File.generated(config, SCHEMA_URI, abs_src_path=str(path)))
    return files


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def operations_table() -> str:
    rows = ["| method | path | what |", "| --- | --- | --- |"]
    for path, item in sorted(_schema.get("paths", {}).items()):
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            summary = op.get("summary") or op.get("description", "").split("\n")[0]
            rows.append(f"| `{method.upper()}` | `{path}` | {_cell(summary)} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, operations_table())
    return markdown
