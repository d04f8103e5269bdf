"""A PEP 517 build backend for fpt's pure-Python package, standard library
only, so that pip builds it offline. The wheel holds fpt/, an fptrun
console script, and fpt/_buildinfo.py naming the repository it was built
from, where the installed package finds build/lib/libfpt.so and bin/fpt
(FPT_LIB and FPT_BIN override them)."""

import base64
import hashlib
import io
import os
import tarfile
import zipfile

NAME, VERSION = "fpt", "0.1.0"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
TAG = "py3-none-any"
DIST = "%s-%s" % (NAME, VERSION)

METADATA = """Metadata-Version: 2.1
Name: %s
Version: %s
Summary: Python and PyTorch bindings of fpt, a parameter server (ctypes over libfpt)
Requires-Python: >=3.9
""" % (NAME, VERSION)


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def _files():
    """(path in the wheel, bytes) of the package."""
    pkg = os.path.join(HERE, "fpt")
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py") and name != "_buildinfo.py":
            with open(os.path.join(pkg, name), "rb") as f:
                yield "fpt/" + name, f.read()
    repo = os.path.dirname(HERE)
    yield "fpt/_buildinfo.py", ("# Written by the build: the repository this package was built from.\n"
                                "REPO = %r\n" % repo).encode()


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (path, digest, len(data))


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    info = DIST + ".dist-info/"
    files = list(_files()) + [
        (info + "METADATA", METADATA.encode()),
        (info + "WHEEL", ("Wheel-Version: 1.0\nGenerator: fpt-backend\nRoot-Is-Purelib: true\nTag: %s\n"
                          % TAG).encode()),
        (info + "entry_points.txt", b"[console_scripts]\nfptrun = fpt.run:main\n"),
    ]
    record = "".join(_record_line(p, d) + "\n" for p, d in files) + info + "RECORD,,\n"
    name = "%s-%s.whl" % (DIST, TAG)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in files:
            z.writestr(p, d)
        z.writestr(info + "RECORD", record)
    return name


def build_sdist(sdist_directory, config_settings=None):
    name = DIST + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ["pyproject.toml", "_build/backend.py"] + ["fpt/" + n for n in sorted(os.listdir(
                os.path.join(HERE, "fpt"))) if n.endswith(".py") and n != "_buildinfo.py"]:
            t.add(os.path.join(HERE, rel), arcname=DIST + "/" + rel)
        data = METADATA.encode()
        ti = tarfile.TarInfo(DIST + "/PKG-INFO")
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
    return name
