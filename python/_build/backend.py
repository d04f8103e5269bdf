"""A PEP 517 build backend for fpt's Python package, standard library
only, so that pip builds it offline. The wheel holds fpt/, the native
files it runs (fpt/_native/libfpt.so and fpt/_native/fpt, from FPT_LIB and
FPT_BIN, else the source tree's build/lib/libfpt.so and bin/fpt: build
them first with scripts/build.sh), and the fptrun and fpt commands. It
records no path of the tree it was built in, so it installs anywhere with
the runtime libraries (libczmq); it is tagged for this platform."""

import base64
import hashlib
import io
import os
import re
import sysconfig
import tarfile
import zipfile

NAME = "fpt"
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # python/
REPO = os.path.dirname(HERE)


def _version():
    with open(os.path.join(HERE, "fpt", "_version.py")) as f:
        return re.search(r'__version__ = "([^"]+)"', f.read()).group(1)


VERSION = _version()
DIST = "%s-%s" % (NAME, VERSION)
# Native code inside: CPython 3 of any minor version, this platform
# (linux_x86_64, say), as the Go toolchain that built it targets.
TAG = "py3-none-" + re.sub(r"[^A-Za-z0-9]", "_", sysconfig.get_platform())

METADATA = """Metadata-Version: 2.1
Name: %s
Version: %s
Summary: Python and PyTorch bindings of fpt, a parameter server (ctypes over libfpt), with its fpt binary
Requires-Python: >=3.9
""" % (NAME, VERSION)

SCRIPTS = b"[console_scripts]\nfptrun = fpt.run:main\nfpt = fpt._cli:main\n"


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def _native():
    """(path in the wheel, path on disk) of the native files."""
    lib = os.environ.get("FPT_LIB") or os.path.join(REPO, "build", "lib", "libfpt.so")
    fpt = os.environ.get("FPT_BIN") or os.path.join(REPO, "bin", "fpt")
    for path in (lib, fpt):
        if not os.path.exists(path):
            raise FileNotFoundError("%s not found: build it first (scripts/build.sh), or set FPT_LIB and FPT_BIN" % path)
    return [("fpt/_native/libfpt.so", lib), ("fpt/_native/fpt", fpt)]


def _files():
    """(path in the wheel, bytes, executable) of the package."""
    pkg = os.path.join(HERE, "fpt")
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py"):
            with open(os.path.join(pkg, name), "rb") as f:
                yield "fpt/" + name, f.read(), False
    for arc, path in _native():
        with open(path, "rb") as f:
            yield arc, f.read(), True


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (path, digest, len(data))


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    info = DIST + ".dist-info/"
    files = list(_files()) + [
        (info + "METADATA", METADATA.encode(), False),
        (info + "WHEEL", ("Wheel-Version: 1.0\nGenerator: fpt-backend\nRoot-Is-Purelib: false\nTag: %s\n"
                          % TAG).encode(), False),
        (info + "entry_points.txt", SCRIPTS, False),
    ]
    record = "".join(_record_line(p, d) + "\n" for p, d, _ in files) + info + "RECORD,,\n"
    name = "%s-%s.whl" % (DIST, TAG)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for p, d, x in files:
            zi = zipfile.ZipInfo(p, date_time=(1980, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            # pip keeps the executable bit of a regular file made on Unix.
            zi.create_system = 3
            zi.external_attr = (0o100755 if x else 0o100644) << 16
            z.writestr(zi, d)
        z.writestr(info + "RECORD", record)
    return name


def build_sdist(sdist_directory, config_settings=None):
    name = DIST + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        for rel in ["pyproject.toml", "_build/backend.py"] + ["fpt/" + n for n in sorted(os.listdir(
                os.path.join(HERE, "fpt"))) if n.endswith(".py")]:
            t.add(os.path.join(HERE, rel), arcname=DIST + "/" + rel)
        data = METADATA.encode()
        ti = tarfile.TarInfo(DIST + "/PKG-INFO")
        ti.size = len(data)
        t.addfile(ti, io.BytesIO(data))
    return name
