"""`cmake --install` puts the package under the prefix at NIBBLE_PYTHON_INSTALL_DIR, and an
interpreter that sees only that directory imports it and runs a model; a package that cannot work
says why at import."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from conftest import BUILD_DIR

SCRIPT = """
import json, os, sys
import nibble
print(os.path.dirname(nibble.__file__))
m = nibble.Model(sys.argv[1], threads=1)
print(json.dumps(m.generate("Once upon a time", max_new_tokens=8, temperature=0)))
"""


def install_dir(build_dir):
    cache = (build_dir / "CMakeCache.txt").read_text()
    m = re.search(r"^NIBBLE_PYTHON_INSTALL_DIR:\w+=(.*)$", cache, re.M)
    assert m, "NIBBLE_PYTHON_INSTALL_DIR is not in the CMake cache"
    return m.group(1)


def test_cmake_install_installs_an_importable_package(model, model_dir, tmp_path):
    if not (BUILD_DIR / "CMakeCache.txt").exists():
        pytest.skip(f"needs the CMake build directory (NIBBLE_BUILD_DIR, or {BUILD_DIR})")
    prefix = tmp_path / "prefix"
    subprocess.run(["cmake", "--install", str(BUILD_DIR), "--prefix", str(prefix), "--component", "python"],
                   check=True, capture_output=True)
    package = prefix / install_dir(BUILD_DIR) / "nibble"
    names = {p.name for p in package.iterdir()}
    assert {"__init__.py", "__init__.pyi", "py.typed", "nibble-export-onnx"} <= names, names
    assert any(n.startswith("_nibble.") and n.endswith(".so") for n in names), names
    assert os.access(package / "nibble-export-onnx", os.X_OK)
    # Only the installed directory on the path, run from elsewhere: not the build tree's package.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(package.parent)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, model_dir], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    where, text = proc.stdout.splitlines()
    assert pathlib.Path(where) == package
    assert json.loads(text) == model.generate("Once upon a time", max_new_tokens=8, temperature=0)


def run_import(pythonpath, prelude=""):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-c", prelude + "import nibble"], capture_output=True, text=True, env=env,
                          timeout=60)


def test_an_unusable_package_says_why_at_import(tmp_path):
    import nibble

    # The package files without the compiled module (a build that skipped the target nibble_python).
    (tmp_path / "nibble").mkdir()
    shutil.copy2(pathlib.Path(nibble.__file__), tmp_path / "nibble" / "__init__.py")
    proc = run_import(tmp_path)
    assert proc.returncode != 0
    assert "has no compiled module" in proc.stderr and "--target nibble_python" in proc.stderr, proc.stderr
    # An interpreter without NumPy (a bare pyenv or venv python): named at import, not at the first array.
    proc = run_import(pathlib.Path(nibble.__file__).parent.parent, "import sys; sys.modules['numpy'] = None; ")
    assert proc.returncode != 0
    assert f"{sys.executable} (Python" in proc.stderr and "cannot import numpy" in proc.stderr, proc.stderr
