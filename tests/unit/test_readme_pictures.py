"""The README's pictures are what their code paths write (issue 30, item 8).

docs/architecture.svg is scripts/architecture_diagram.py's output, byte for byte (edit the script, run it, commit
both); docs/status_page.png is the screenshot tests/integration/test_status_page.py takes of a real run
(``PSFLOW_SCREENSHOT_DIR=docs``), and the README shows both.
"""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_architecture_diagram_is_the_scripts_output() -> None:
    script = runpy.run_path(str(REPO / "scripts" / "architecture_diagram.py"))
    assert (REPO / "docs" / "architecture.svg").read_text() == script["diagram"](), (
        "docs/architecture.svg differs from what scripts/architecture_diagram.py writes: run it and commit both")


def test_the_readme_shows_both_pictures() -> None:
    readme = (REPO / "README.md").read_text()
    assert "(docs/architecture.svg)" in readme and "(docs/status_page.png)" in readme
    png = (REPO / "docs" / "status_page.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_the_diagram_script_takes_help_as_help_not_as_a_file_name(tmp_path: Path) -> None:
    """``python scripts/architecture_diagram.py --help`` (the README names the script) wrote a file named --help."""
    for flag in ("--help", "-h"):
        run = subprocess.run([sys.executable, str(REPO / "scripts" / "architecture_diagram.py"), flag], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0 and "docs/architecture.svg" in run.stdout, run
        assert not list(tmp_path.iterdir()), f"{flag} wrote {list(tmp_path.iterdir())}"
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "architecture_diagram.py"), "--out", "x.svg"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--out" in run.stderr and not list(tmp_path.iterdir()), run
