"""Named layers, composition and trusted exec against a real ``warren serve``."""
import asyncio
import io
import os
import shutil
import tarfile
import tempfile
import unittest
import uuid

try:
    from . import _support
except ImportError:
    import _support

import warren
from warren.aio import AsyncClient

SRV = None  # type: _support.WarrenServer
C = None  # type: warren.Client
NS = "py" + uuid.uuid4().hex[:8]


def setUpModule():
    global SRV, C
    SRV = _support.acquire_server()
    C = warren.Client(SRV.url, token=SRV.token, timeout=60)


def tearDownModule():
    try:
        for layer in C.layers():
            if layer.name.startswith(NS + "/"):
                try:
                    C.delete_layer(layer.ref)
                except warren.WarrenError:
                    pass
        C.close()
    finally:
        _support.release_server()


def tar_of(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class LayersTest(unittest.TestCase):
    def test_create_compose_delete(self):
        name = NS + "/ws"
        l1 = C.create_layer(name, tar=tar_of({"work/a": b"one\n"}))
        self.assertEqual((l1.name, l1.version), (name, 1))
        self.assertTrue(l1.digest.startswith("sha256:") and l1.stored_size > 0)
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        os.makedirs(os.path.join(d, "work"))
        with open(os.path.join(d, "work", "a"), "w") as f:
            f.write("two\n")
        l2 = C.create_layer(name, directory=d)
        self.assertEqual(l2.version, 2)
        self.assertEqual(C.layer(name).version, 2)
        self.assertEqual([x.version for x in C.layers(name)], [1, 2])

        sb = C.create(image=_support.IMAGE, layers=[l1.ref])
        try:
            self.assertEqual(sb.run("cat /work/a").stdout, "one\n")
            sb.run("echo built > /work/b", check=True)
            l3 = C.create_layer(NS + "/built", from_sandbox=sb.id)
            self.assertTrue(l3.source.startswith("sandbox "))
        finally:
            sb.stop()
        sb = C.create(image=_support.IMAGE, layers=[name, NS + "/built"])
        try:
            self.assertEqual(sb.run("cat /work/a /work/b").stdout, "two\nbuilt\n")
            with self.assertRaises(warren.BadRequest):
                sb.run("true", trusted=True)
        finally:
            sb.stop()

        with self.assertRaises(warren.NotFound):
            C.create(image=_support.IMAGE, layers=[NS + "/missing"])
        with self.assertRaises(warren.WarrenError):
            C.create_layer("Bad Name", tar=tar_of({"a": b""}))
        with self.assertRaises(warren.Conflict):
            C.create_layer(name, tar=tar_of({"x": b"y"}), version=1)
        gone = C.delete_layer(name + "@1")
        self.assertEqual([x.version for x in gone], [1])
        with self.assertRaises(warren.NotFound):
            C.layer(name + "@1")
        self.assertIn("removed", C.gc_layers())

    def test_async(self):
        async def main():
            async with AsyncClient(SRV.url, token=SRV.token) as ac:
                lay = await ac.create_layer(NS + "/aio", tar=tar_of({"f": b"x"}))
                self.assertEqual(lay.version, 1)
                self.assertEqual((await ac.layer(NS + "/aio@1")).digest, lay.digest)
                self.assertIn(NS + "/aio", [x.name for x in await ac.layers()])
                await ac.delete_layer(NS + "/aio")
        asyncio.run(main())


class ImagesTest(unittest.TestCase):
    def test_commit_and_import(self):
        lay = C.create_layer(NS + "/img", tar=tar_of({"opt/app/marker": b"layer\n"}))
        img = C.commit_image(NS + "-img:1", base="busybox", layers=[lay.ref],
                             config={"env": ["APP=1"], "working_dir": "/opt/app", "user": "nobody"})
        self.assertEqual(img.config.get("working_dir"), "/opt/app")
        self.assertEqual(img.layers[-1], lay.digest)
        sb = C.create(image=NS + "-img:1")
        try:
            r = sb.run("id -u; pwd; echo $APP; cat marker")
            self.assertEqual(r.stdout, "65534\n/opt/app\n1\nlayer\n")
        finally:
            sb.stop()
        # An upload of a root filesystem tarball through the API.
        with open("/bin/busybox", "rb") as f:
            bb = f.read()
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for name, data, mode in (("bin/busybox", bb, 0o755), ("etc/marker", b"uploaded\n", 0o644)):
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), mode
                tf.addfile(info, io.BytesIO(data))
            link = tarfile.TarInfo("bin/sh")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tf.addfile(link)
        up = C.import_image(NS + "-up:1", buf.getvalue())
        self.assertEqual(len(up.layers), 1)
        sb = C.create(image=NS + "-up:1")
        try:
            self.assertEqual(sb.run("/bin/busybox cat /etc/marker").stdout, "uploaded\n")
        finally:
            sb.stop()
        with self.assertRaises(warren.WarrenError):
            C.import_image(NS + "-bad", b"not an archive" * 100)


if __name__ == "__main__":
    unittest.main()
