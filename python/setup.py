"""`pip install ./python --no-build-isolation`: builds the binding with the project's CMake (Debian's
cmake, ninja, pybind11-dev, python3-dev; the other build dependencies of scripts/setup.sh) in
build/pip (NIBBLE_BUILD_DIR overrides) and installs the package with nibble-export-onnx beside it.
The usual way is PYTHONPATH=build/release/python (docs/PYTHON.md)."""

import os
import pathlib
import re
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent


def project_version():
    m = re.search(r"project\(nibble VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text())
    return m.group(1) if m else "0.0.0"


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        build_dir = pathlib.Path(os.environ.get("NIBBLE_BUILD_DIR") or ROOT / "build" / "pip")
        configure = ["cmake", "-S", str(ROOT), "-B", str(build_dir), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                     "-DNIBBLE_BUILD_TESTS=OFF", "-DNIBBLE_PYTHON=ON", f"-DPython3_EXECUTABLE={sys.executable}"]
        if shutil.which("ccache"):
            configure += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_C_COMPILER_LAUNCHER=ccache"]
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "nibble_python", "nibble-export-onnx",
                               "-j", str(os.cpu_count() or 1)])
        dest = pathlib.Path(self.build_lib) / "nibble"
        dest.mkdir(parents=True, exist_ok=True)
        for module in (build_dir / "python" / "nibble").glob("_nibble*.so"):
            shutil.copy2(module, dest / module.name)
        shutil.copy2(build_dir / "nibble-export-onnx", dest / "nibble-export-onnx")


class BinaryDistribution(Distribution):
    """The package holds a compiled module: the wheel is tagged for this platform and Python."""

    def has_ext_modules(self):
        return True


setup(
    name="nibble",
    distclass=BinaryDistribution,
    version=project_version(),
    description="int4 quantization (RTN, AWQ, GPTQ) and CPU inference of Llama-family models",
    packages=["nibble"],
    package_data={"nibble": ["__init__.pyi", "py.typed"]},
    python_requires=">=3.9",
    install_requires=["numpy"],
    cmdclass={"build_py": BuildWithCMake},
    zip_safe=False,
)
