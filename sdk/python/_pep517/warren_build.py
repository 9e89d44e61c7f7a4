"""A tiny PEP 517 build backend (standard library only) so that
``pip install ./sdk/python`` works offline, with nothing to download: no
setuptools, no wheel. It builds a pure-Python wheel of the ``warren`` package,
an sdist, and an editable wheel (PEP 660).

This is source, not a build artifact: pyproject.toml points here
(``backend-path = ["_pep517"]``)."""

import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "warren"
SUMMARY = ("Python SDK for warren, the open-source sandbox platform "
           "(standard library only, sync and asyncio)")


def _version():
    with open(os.path.join(ROOT, NAME, "_version.py")) as f:
        return re.search(r'__version__\s*=\s*"([^"]+)"', f.read()).group(1)


def _metadata():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\n"
            "License: Apache-2.0\nRequires-Python: >=3.9\n"
            "Classifier: Programming Language :: Python :: 3\n"
            "Classifier: Framework :: AsyncIO\nClassifier: Typing :: Typed\n"
            "Description-Content-Type: text/markdown\n\n%s" % (NAME, _version(), SUMMARY, readme))


def _package_files():
    pkg = os.path.join(ROOT, NAME)
    for dirpath, dirnames, filenames in os.walk(pkg):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for fn in sorted(filenames):
            if fn.endswith((".py", ".typed")):
                full = os.path.join(dirpath, fn)
                yield full, os.path.relpath(full, ROOT).replace(os.sep, "/")


def _digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _write_wheel(wheel_directory, entries):
    dist_info = "%s-%s.dist-info" % (NAME, _version())
    name = "%s-%s-py3-none-any.whl" % (NAME, _version())
    entries = list(entries) + [
        (dist_info + "/METADATA", _metadata().encode("utf-8")),
        (dist_info + "/WHEEL", b"Wheel-Version: 1.0\nGenerator: warren_build\n"
                               b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
        (dist_info + "/top_level.txt", (NAME + "\n").encode()),
    ]
    record = "".join("%s,%s,%d\n" % (p, _digest(d), len(d)) for p, d in entries)
    record += dist_info + "/RECORD,,\n"
    stamp = time.localtime(max(time.time(), 315532800))[:6]
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in entries + [(dist_info + "/RECORD", record.encode())]:
            zi = zipfile.ZipInfo(p, stamp)
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, d)
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    entries = []
    for full, rel in _package_files():
        with open(full, "rb") as f:
            entries.append((rel, f.read()))
    return _write_wheel(wheel_directory, entries)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    pth = (ROOT + "\n").encode()
    return _write_wheel(wheel_directory, [("_warren_editable.pth", pth)])


def build_sdist(sdist_directory, config_settings=None):
    base = "%s-%s" % (NAME, _version())
    name = base + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz", format=tarfile.PAX_FORMAT) as t:
        files = [(os.path.join(ROOT, p), p) for p in ("pyproject.toml", "README.md",
                                                      "_pep517/warren_build.py")]
        files += list(_package_files())
        for full, rel in files:
            t.add(full, arcname=base + "/" + rel)
        info = tarfile.TarInfo(base + "/PKG-INFO")
        data = _metadata().encode("utf-8")
        info.size = len(data)
        info.mtime = int(time.time())
        t.addfile(info, io.BytesIO(data))
    return name
